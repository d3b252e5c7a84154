/*
 * The compiled launcher's half of shim/resident/call.py: an owned verb handed to gpuckpt-runtimed, the
 * resident helper, without starting an interpreter first (~17 ms of every checkpoint and restore).
 *
 * The same wire as shim/resident/messages.py: marshal'd tuples (version 2, which has no back-references, both
 * ways) with fds on a SOCK_SEQPACKET socket. The listener is checked as peer_refusal() checks it: root, in
 * all our namespaces, with at least our capabilities, no confinement we lack, proven by a pidfd. Until a
 * worker has taken the call nothing was done and the caller gets RESIDENT_NOT_TAKEN (the Python shim then
 * works the verb); after it, this process starts and reaps what the worker asks for (shim/resident/caller.py's
 * messages) and passes on the signals it gets, until the worker says the verb's exit status.
 */
#define _GNU_SOURCE
#include "resident_call.h"
#include "resident_contract.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* shim/resident/call.py's and shim/resident/messages.py's constants (resident_contract.h, generated from them) */
#define PROTOCOL CALL_PROTOCOL
#define SOCKET_NAME CALL_SOCKET_NAME
#define MAX_MESSAGE WIRE_MAX_MESSAGE
#define MAX_FDS WIRE_MAX_FDS
#define FIRST_ANSWER_TIMEOUT_S CALL_FIRST_ANSWER_TIMEOUT_S
#define SO_PEERPIDFD_OPTION PEER_SO_PEERPIDFD
#define MAX_DEPTH 4 /* ("spawn", [argv], {env}, [targets], close_fds): a tuple of lists and a dict */
static const char *const NAMESPACES[] = PEER_NAMESPACES;
static const int FORWARDED[] = CALL_FORWARDED;
static const int DEFAULT_SIGNALS[] = CALL_DEFAULT_SIGNALS;
_Static_assert(WIRE_MARSHAL_VERSION == 2, "the marshal below is version 2's: no back-references, no other types");
_Static_assert(sizeof(int) == 4, "fds go as 4 bytes each (shim/resident/messages.py's FD_BYTES)");
_Static_assert(sizeof NAMESPACES / sizeof *NAMESPACES <= 8, "listener_is_our_equal holds 8 namespaces' ids");

/* ---- marshal, version 2: the types our messages use ---- */

struct out {
    unsigned char *data;
    size_t length, size;
    int failed;
};

static void put(struct out *out, const void *bytes, size_t length)
{
    if (out->failed || length > MAX_MESSAGE - out->length) {
        out->failed = 1;
        return;
    }
    if (out->length + length > out->size) {
        size_t size = out->size ? out->size : 4096;
        unsigned char *grown;
        while (size < out->length + length)
            size *= 2;
        if (!(grown = realloc(out->data, size))) {
            out->failed = 1;
            return;
        }
        out->data = grown, out->size = size;
    }
    memcpy(out->data + out->length, bytes, length);
    out->length += length;
}

static void put_header(struct out *out, char type, int32_t number)
{
    unsigned char bytes[5] = {(unsigned char)type, (unsigned char)number, (unsigned char)(number >> 8),
                              (unsigned char)(number >> 16), (unsigned char)(number >> 24)};
    put(out, bytes, sizeof bytes);
}

static void put_int(struct out *out, int32_t number)
{
    put_header(out, 'i', number);
}

static void put_text(struct out *out, const char *text, size_t length)
{
    if (length > MAX_MESSAGE) {
        out->failed = 1;
        return;
    }
    put_header(out, 'u', (int32_t)length);
    put(out, text, length);
}

static void put_string(struct out *out, const char *text)
{
    put_text(out, text, strlen(text));
}

enum kind { NONE, BOOL, INT, TEXT, SEQUENCE, DICT };

struct value {
    enum kind kind;
    long number;         /* BOOL, INT */
    const char *text;    /* TEXT: in the message, not NUL-terminated */
    size_t length;       /* TEXT: bytes; SEQUENCE: items; DICT: keys and values, alternating */
    struct value *items; /* SEQUENCE, DICT */
};

struct in {
    const unsigned char *data;
    size_t length, at;
};

static int take_i32(struct in *in, int32_t *number)
{
    if (in->length - in->at < 4)
        return 0;
    *number = (int32_t)((uint32_t)in->data[in->at] | (uint32_t)in->data[in->at + 1] << 8 |
                        (uint32_t)in->data[in->at + 2] << 16 | (uint32_t)in->data[in->at + 3] << 24);
    in->at += 4;
    return 1;
}

static void free_value(struct value *value)
{
    if (value->kind == SEQUENCE || value->kind == DICT) {
        for (size_t i = 0; i < value->length; i++)
            free_value(&value->items[i]);
        free(value->items);
    }
    value->kind = NONE;
}

/* One value at in->at; 0 for what our messages never hold (the caller then treats the peer as gone). */
static int take_value(struct in *in, struct value *value, int depth)
{
    int32_t count;
    unsigned char type;
    memset(value, 0, sizeof *value);
    if (in->at >= in->length || depth > MAX_DEPTH)
        return 0;
    type = in->data[in->at++];
    switch (type) {
    case 'N':
        return 1;
    case 'T':
    case 'F':
        value->kind = BOOL, value->number = type == 'T';
        return 1;
    case 'i':
        value->kind = INT;
        if (!take_i32(in, &count))
            return 0;
        value->number = count;
        return 1;
    case 'u':
        if (!take_i32(in, &count) || count < 0 || (size_t)count > in->length - in->at)
            return 0;
        value->kind = TEXT, value->text = (const char *)in->data + in->at, value->length = (size_t)count;
        in->at += (size_t)count;
        return 1;
    case '(':
    case '[':
        if (!take_i32(in, &count) || count < 0 || (size_t)count > in->length - in->at)
            return 0; /* every item takes at least a byte */
        value->kind = SEQUENCE;
        if (count && !(value->items = calloc((size_t)count, sizeof *value->items)))
            return 0;
        for (int32_t i = 0; i < count; i++) {
            value->length = (size_t)i + 1;
            if (!take_value(in, &value->items[i], depth + 1)) {
                free_value(value);
                return 0;
            }
        }
        return 1;
    case '{':
        value->kind = DICT;
        for (;;) {
            struct value *grown;
            if (in->at < in->length && in->data[in->at] == '0') {
                in->at++;
                return 1;
            }
            if (value->length + 2 > in->length || !(grown = realloc(value->items, (value->length + 2) *
                                                                                  sizeof *value->items))) {
                free_value(value);
                return 0;
            }
            value->items = grown;
            memset(&value->items[value->length], 0, 2 * sizeof *value->items);
            value->length += 2;
            if (!take_value(in, &value->items[value->length - 2], depth + 1) ||
                !take_value(in, &value->items[value->length - 1], depth + 1)) {
                free_value(value);
                return 0;
            }
        }
    default:
        return 0;
    }
}

static int is_text(const struct value *value, const char *text)
{
    return value->kind == TEXT && value->length == strlen(text) && memcmp(value->text, text, value->length) == 0;
}

/* A TEXT value as a C string, as os.fsencode gives it to a program: a surrogate escape (U+DC80..U+DCFF, a byte
 * that was not UTF-8, which marshal writes as ED B2 80..ED B3 BF) is that byte again. NULL if it holds a NUL (no
 * program takes one) or another surrogate (fsencode refuses them), or memory ran out. */
static char *c_string(const struct value *value)
{
    const unsigned char *text = (const unsigned char *)value->text;
    char *string, *to;
    if (value->kind != TEXT || memchr(value->text, '\0', value->length) || !(string = malloc(value->length + 1)))
        return NULL;
    to = string;
    for (size_t i = 0; i < value->length; i++) {
        if (text[i] == 0xed && i + 2 < value->length && text[i + 1] >= 0xa0) {
            if ((text[i + 1] != 0xb2 && text[i + 1] != 0xb3) || (text[i + 2] & 0xc0) != 0x80) {
                free(string);
                return NULL;
            }
            *to++ = (char)((text[i + 1] == 0xb3 ? 0xc0 : 0x80) | (text[i + 2] & 0x3f));
            i += 2;
        } else {
            *to++ = (char)text[i];
        }
    }
    *to = '\0';
    return string;
}

/* Strict UTF-8 without surrogates: what Python decodes back to the same bytes (argv and environment). */
static int utf8(const char *text)
{
    const unsigned char *at = (const unsigned char *)text;
    while (*at) {
        unsigned char first = *at;
        int more = first < 0x80 ? 0 : first >= 0xc2 && first < 0xe0 ? 1 : first >= 0xe0 && first < 0xf0 ? 2
                 : first >= 0xf0 && first < 0xf5 ? 3 : -1;
        if (more < 0)
            return 0;
        for (int i = 1; i <= more; i++)
            if ((at[i] & 0xc0) != 0x80)
                return 0;
        if ((first == 0xe0 && at[1] < 0xa0) || (first == 0xed && at[1] >= 0xa0) || (first == 0xf0 && at[1] < 0x90) ||
            (first == 0xf4 && at[1] >= 0x90))
            return 0; /* overlong, a surrogate, past U+10FFFF */
        at += more + 1;
    }
    return 1;
}

/* ---- the socket ---- */

static int send_message(int sock, const struct out *out, const int *fds, int count)
{
    struct iovec iov = {.iov_base = out->data, .iov_len = out->length};
    union {
        char buffer[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } control;
    struct msghdr header = {.msg_iov = &iov, .msg_iovlen = 1};
    if (out->failed || count > MAX_FDS)
        return 0;
    if (count) {
        struct cmsghdr *cmsg;
        memset(&control, 0, sizeof control);
        header.msg_control = control.buffer;
        header.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)count);
        cmsg = CMSG_FIRSTHDR(&header);
        cmsg->cmsg_level = SOL_SOCKET, cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)count);
        memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * (size_t)count);
    }
    while (sendmsg(sock, &header, MSG_NOSIGNAL) < 0)
        if (errno != EINTR)
            return 0;
    return 1;
}

/* The next message, a tuple, and the fds it carried (close-on-exec); 0 at the end, on error, or for garbage. */
static int receive_message(int sock, unsigned char *buffer, struct value *message, int *fds, int *count)
{
    union {
        char buffer[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = buffer, .iov_len = MAX_MESSAGE};
    struct msghdr header = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buffer,
                            .msg_controllen = sizeof control.buffer};
    struct in in;
    ssize_t got;
    *count = 0;
    memset(message, 0, sizeof *message); /* NONE until parsed: at the peer's end or a cut message nothing is */
    while ((got = recvmsg(sock, &header, MSG_CMSG_CLOEXEC)) < 0)
        if (errno != EINTR)
            return 0;
    for (struct cmsghdr *cmsg = CMSG_FIRSTHDR(&header); cmsg; cmsg = CMSG_NXTHDR(&header, cmsg)) {
        if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
            continue;
        for (size_t i = 0; i < (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof fd);
            if (*count < MAX_FDS)
                fds[(*count)++] = fd;
            else
                close(fd);
        }
    }
    in = (struct in){.data = buffer, .length = (size_t)got};
    if (got == 0 || (header.msg_flags & MSG_TRUNC) || !take_value(&in, message, 0) || in.at != in.length ||
        message->kind != SEQUENCE || message->length == 0) {
        if (message->kind != NONE)
            free_value(message);
        for (int i = 0; i < *count; i++)
            close(fds[i]);
        *count = 0;
        return 0;
    }
    return 1;
}

static void close_all(const int *fds, int count)
{
    for (int i = 0; i < count; i++)
        close(fds[i]);
}

/* ---- the listener's powers (shim/resident/messages.py's peer_refusal) ---- */

static int namespaces_of(const char *pid, struct stat ids[])
{
    char path[64];
    for (int i = 0; NAMESPACES[i]; i++) {
        snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, NAMESPACES[i]);
        if (stat(path, &ids[i]) != 0)
            return 0;
    }
    return 1;
}

struct powers {
    unsigned long long capabilities;
    int no_new_privs, seccomp;
    struct stat root;
};

static int powers_of(const char *pid, struct powers *powers)
{
    char path[64], line[256];
    FILE *status;
    powers->capabilities = PEER_CAPEFF_IF_MISSING, powers->no_new_privs = PEER_NONEWPRIVS_IF_MISSING,
    powers->seccomp = PEER_SECCOMP_IF_MISSING; /* missing: the most confined */
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    if (!(status = fopen(path, "re")))
        return 0;
    while (fgets(line, sizeof line, status)) {
        if (strncmp(line, "CapEff:", 7) == 0)
            powers->capabilities = strtoull(line + 7, NULL, 16);
        else if (strncmp(line, "NoNewPrivs:", 11) == 0)
            powers->no_new_privs = atoi(line + 11);
        else if (strncmp(line, "Seccomp:", 8) == 0)
            powers->seccomp = atoi(line + 8);
    }
    fclose(status);
    snprintf(path, sizeof path, "/proc/%s/root", pid);
    return stat(path, &powers->root) == 0;
}

/* Whether the listener at the other end of `sock` is root with all our powers, still the process that listened. */
static int listener_is_our_equal(int sock)
{
    struct ucred peer;
    socklen_t length = sizeof peer;
    struct stat theirs[8], ours[8];
    struct powers their_powers, our_powers;
    char pid[24];
    int pidfd, equal;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || peer.uid != 0)
        return 0;
    length = sizeof pidfd;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD_OPTION, &pidfd, &length) != 0) {
        if (errno != ENOPROTOOPT)
            return 0;
        pidfd = (int)syscall(SYS_pidfd_open, peer.pid, 0); /* an older kernel: the PID's process now */
        if (pidfd < 0)
            return 0;
    }
    snprintf(pid, sizeof pid, "%d", (int)peer.pid);
    equal = namespaces_of(pid, theirs) && namespaces_of("self", ours) && powers_of(pid, &their_powers) &&
            powers_of("self", &our_powers);
    for (int i = 0; equal && NAMESPACES[i]; i++)
        equal = theirs[i].st_dev == ours[i].st_dev && theirs[i].st_ino == ours[i].st_ino;
    equal = equal && (their_powers.capabilities & our_powers.capabilities) == our_powers.capabilities &&
            their_powers.no_new_privs <= our_powers.no_new_privs && !(their_powers.seccomp && !our_powers.seccomp) &&
            their_powers.root.st_dev == our_powers.root.st_dev && their_powers.root.st_ino == our_powers.root.st_ino &&
            syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0; /* what we read was still the listener's */
    close(pidfd);
    return equal;
}

struct name {
    const char *entry;
    size_t length, index;
};

static int by_name_then_place(const void *a, const void *b)
{
    const struct name *x = a, *y = b;
    int order = memcmp(x->entry, y->entry, x->length < y->length ? x->length : y->length);
    if (order == 0)
        order = (x->length > y->length) - (x->length < y->length);
    return order ? order : (x->index > y->index) - (x->index < y->index);
}

/* Which of environ's entries os.environ holds: those with a name, and of a name given twice its first (getenv's);
 * NULL when memory ran out. */
static unsigned char *environment_kept(void)
{
    size_t count = 0, named = 0;
    struct name *names;
    unsigned char *kept;
    while (environ[count])
        count++;
    names = calloc(count + 1, sizeof *names);
    kept = calloc(count + 1, 1);
    if (!names || !kept) {
        free(names), free(kept);
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        const char *equals = strchr(environ[i], '=');
        if (equals && equals != environ[i])
            names[named++] = (struct name){environ[i], (size_t)(equals - environ[i]), i};
    }
    qsort(names, named, sizeof *names, by_name_then_place);
    for (size_t i = 0; i < named; i++)
        kept[names[i].index] = i == 0 || names[i].length != names[i - 1].length ||
                               memcmp(names[i].entry, names[i - 1].entry, names[i].length) != 0;
    free(names);
    return kept;
}

static int connect_helper(void)
{
    const char *state = getenv(PATHS_STATE_DIR_ENV);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    int sock;
    if ((size_t)snprintf(address.sun_path, sizeof address.sun_path, "%s/%s", state && *state ? state : PATHS_DEFAULT_STATE_DIR,
                         SOCKET_NAME) >= sizeof address.sun_path)
        return -1;
    if ((sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
        return -1;
    /* not blocking: a listener whose queue is full (stopped, hung) is refused at once (EAGAIN), not waited for */
    if (connect(sock, (struct sockaddr *)&address, sizeof address) != 0 || fcntl(sock, F_SETFL, 0) != 0 ||
        !listener_is_our_equal(sock)) {
        close(sock);
        return -1;
    }
    return sock;
}

/* shim/resident/call.py's package_identity(): which installed gpuckpt the helper must be running. */
static int package_identity(const char *site, char *identity, size_t size)
{
    char package[PATH_MAX], where[PATH_MAX], main_py[PATH_MAX];
    struct stat status;
    if ((size_t)snprintf(where, sizeof where, "%s/gpuckpt", site) >= sizeof where || !realpath(where, package) ||
        (size_t)snprintf(main_py, sizeof main_py, "%s/shim/main.py", package) >= sizeof main_py ||
        stat(main_py, &status) != 0)
        return 0;
    return (size_t)snprintf(identity, size, "%s:%llu:%lld", package, (unsigned long long)status.st_ino,
                            (long long)status.st_mtim.tv_sec * 1000000000LL + status.st_mtim.tv_nsec) < size;
}

/* ---- serving the worker (shim/resident/caller.py's requests) ---- */

static volatile sig_atomic_t worker_pid;

static void forward(int signum)
{
    int saved = errno;
    if (worker_pid > 0)
        kill((pid_t)worker_pid, signum);
    errno = saved;
}

static void forward_signals(void (*handler)(int))
{
    struct sigaction action = {.sa_handler = handler, .sa_flags = SA_RESTART};
    sigemptyset(&action.sa_mask);
    for (int i = 0; FORWARDED[i]; i++)
        sigaction(FORWARDED[i], &action, NULL);
}

static char **c_strings(const struct value *sequence)
{
    char **strings = calloc(sequence->length + 1, sizeof *strings);
    for (size_t i = 0; strings && i < sequence->length; i++)
        if (!(strings[i] = c_string(&sequence->items[i]))) {
            for (size_t j = 0; j < i; j++)
                free(strings[j]);
            free(strings);
            return NULL;
        }
    return strings;
}

static char **c_environment(const struct value *dict)
{
    char **strings = calloc(dict->length / 2 + 1, sizeof *strings);
    for (size_t i = 0; strings && i < dict->length / 2; i++) {
        char *name = c_string(&dict->items[2 * i]), *value = c_string(&dict->items[2 * i + 1]);
        if (!name || !value || !*name || strchr(name, '=') || asprintf(&strings[i], "%s=%s", name, value) < 0) {
            strings[i] = NULL;
            free(name), free(value);
            for (size_t j = 0; j < i; j++)
                free(strings[j]);
            free(strings);
            return NULL;
        }
        free(name), free(value);
    }
    return strings;
}

static void free_strings(char **strings)
{
    for (char **at = strings; at && *at; at++)
        free(*at);
    free(strings);
}

/* ("spawn", argv, env, targets, close_others) with one fd per target: ("spawned", pid) with its pidfd, or
 * ("failed", errno, text). The delegate gets every fd of ours (the engine's for it), a program whose output the
 * worker reads only its stdio (close_others); each its signals at their defaults. */
static int valid_spawn(const struct value *request, int count)
{
    const struct value *targets = &request->items[3];
    if (request->items[1].kind != SEQUENCE || request->items[1].length == 0 || request->items[2].kind != DICT ||
        targets->kind != SEQUENCE || targets->length != (size_t)count || request->items[4].kind != BOOL)
        return 0;
    for (int i = 0; i < count; i++)
        if (targets->items[i].kind != INT || targets->items[i].number < 0 || targets->items[i].number > 2)
            return 0;
    return 1;
}

/* Every fd of ours a program would inherit, other than the targets, closed in it. */
static void close_inherited(posix_spawn_file_actions_t *actions, const struct value *targets)
{
    DIR *listing = opendir("/proc/self/fd");
    struct dirent *entry;
    while (listing && (entry = readdir(listing))) {
        int fd = atoi(entry->d_name), flags, target = 0;
        for (size_t i = 0; i < targets->length; i++)
            target |= targets->items[i].number == fd;
        if (fd > 2 && fd != dirfd(listing) && !target && (flags = fcntl(fd, F_GETFD)) >= 0 && !(flags & FD_CLOEXEC))
            posix_spawn_file_actions_addclose(actions, fd);
    }
    if (listing)
        closedir(listing);
}

/* ("spawn", argv, env, targets, close_others) with one fd per target: ("spawned", pid) with its pidfd, or
 * ("failed", errno, text). The delegate gets every fd of ours (the engine's for it), a program whose output the
 * worker reads only its stdio (close_others); each its signals at their defaults, as subprocess gives them. */
static void spawn(const struct value *request, const int *fds, int count, struct out *answer, int *pidfd)
{
    char **argv = NULL, **envp = NULL;
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    sigset_t defaults;
    pid_t pid = 0;
    int error = EINVAL;
    *pidfd = -1;
    if (valid_spawn(request, count) && (argv = c_strings(&request->items[1])) &&
        (envp = c_environment(&request->items[2]))) {
        posix_spawn_file_actions_init(&actions);
        posix_spawnattr_init(&attributes);
        sigemptyset(&defaults);
        for (int i = 0; DEFAULT_SIGNALS[i]; i++)
            sigaddset(&defaults, DEFAULT_SIGNALS[i]);
        posix_spawnattr_setsigdefault(&attributes, &defaults);
        posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
        for (int i = 0; i < count; i++)
            posix_spawn_file_actions_adddup2(&actions, fds[i], (int)request->items[3].items[i].number);
        if (request->items[4].number)
            close_inherited(&actions, &request->items[3]);
        error = posix_spawnp(&pid, argv[0], &actions, &attributes, argv, envp);
        posix_spawn_file_actions_destroy(&actions);
        posix_spawnattr_destroy(&attributes);
    }
    free_strings(argv);
    free_strings(envp);
    if (error == 0 && (*pidfd = (int)syscall(SYS_pidfd_open, pid, 0)) < 0) {
        error = errno; /* started, but the worker cannot watch it: ended and reaped here, as it never ran */
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    put_header(answer, '(', error == 0 ? 2 : 3);
    if (error == 0) {
        put_string(answer, "spawned");
        put_int(answer, (int32_t)pid);
    } else {
        put_string(answer, "failed");
        put_int(answer, error);
        put_string(answer, strerror(error));
    }
}

static int reaped(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 255;
    return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

static void wait_for_children(void)
{
    while (wait(NULL) >= 0 || errno == EINTR)
        ;
}

/* What the worker asks for until it says the verb's exit status; -1 when it went away first. */
static int serve(int sock, unsigned char *buffer)
{
    for (;;) {
        struct value message;
        struct out answer = {0};
        int fds[MAX_FDS], count, pidfd = -1, sent, ended = 0, status = -1;
        if (!receive_message(sock, buffer, &message, fds, &count))
            return -1;
        if (is_text(&message.items[0], "exit") && message.length == 2 && message.items[1].kind == INT) {
            status = (int)(message.items[1].number & 0xff), ended = 1; /* as sys.exit() gives it to the shell */
        } else if (is_text(&message.items[0], "spawn") && message.length == 5) {
            spawn(&message, fds, count, &answer, &pidfd);
        } else if (is_text(&message.items[0], "wait") && message.length == 2 && message.items[1].kind == INT) {
            put_header(&answer, '(', 2);
            put_string(&answer, "waited");
            put_int(&answer, reaped((pid_t)message.items[1].number));
        } else {
            ended = 1; /* not a request of ours: as if the worker went away */
        }
        close_all(fds, count);
        free_value(&message);
        if (ended) {
            free(answer.data);
            return status;
        }
        sent = send_message(sock, &answer, &pidfd, pidfd >= 0 ? 1 : 0);
        free(answer.data);
        if (pidfd >= 0)
            close(pidfd);
        if (!sent)
            return -1;
    }
}

/* ---- the call (shim/resident/call.py's, field by field in CALL_FIELDS' order) ---- */

struct call {
    const char *identity, *own, *delegate, *hook;
    int argc;
    char **argv;
    const unsigned char *kept; /* environment_kept()'s */
    mode_t mask;
};

static void put_kind(struct out *out, const struct call *call)
{
    (void)call;
    put_string(out, "call");
}

static void put_protocol(struct out *out, const struct call *call)
{
    (void)call;
    put_int(out, PROTOCOL);
}

static void put_identity(struct out *out, const struct call *call)
{
    put_string(out, call->identity);
}

static void put_program(struct out *out, const struct call *call)
{
    put_string(out, call->own);
}

static void put_argv(struct out *out, const struct call *call)
{
    put_header(out, '[', call->argc - 1);
    for (int i = 1; i < call->argc; i++)
        put_string(out, call->argv[i]);
}

static void put_environment(struct out *out, const struct call *call)
{
    put(out, "{", 1);
    for (size_t i = 0; environ[i]; i++) {
        const char *equals = strchr(environ[i], '=');
        if (!call->kept[i])
            continue; /* Python's os.environ holds no such entry */
        put_text(out, environ[i], (size_t)(equals - environ[i]));
        put_string(out, equals + 1);
    }
    put(out, "0", 1);
}

static void put_umask(struct out *out, const struct call *call)
{
    put_int(out, (int32_t)call->mask);
}

static void put_delegate(struct out *out, const struct call *call)
{
    put_string(out, call->delegate);
}

static void put_hook(struct out *out, const struct call *call)
{
    put_string(out, call->hook);
}

static void put_call(struct out *out, const struct call *call)
{
#define PUT_FIELD(name) put_##name(out, call);
    put_header(out, '(', CALL_FIELD_COUNT);
    CALL_FIELDS(PUT_FIELD)
#undef PUT_FIELD
}

int call_resident(const char *site, const char *own, int argc, char **argv, const char *delegate, const char *hook)
{
    char identity[PATH_MAX + 64];
    struct out call = {0};
    struct value answer;
    struct timeval timeout = {.tv_sec = FIRST_ANSWER_TIMEOUT_S}, none = {0};
    unsigned char *buffer;
    mode_t mask;
    unsigned char *kept;
    int sock, cwd, fds[MAX_FDS] = {0, 1, 2, -1}, count, taken, status;

    if (!package_identity(site, identity, sizeof identity) || !utf8(own))
        return RESIDENT_NOT_TAKEN;
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0)
            return RESIDENT_NOT_TAKEN; /* closed: our socket would take its number and go to the worker as our stdio */
    for (int i = 1; i < argc; i++)
        if (!utf8(argv[i]))
            return RESIDENT_NOT_TAKEN; /* Python's argv would hold what marshal cannot send as it came */
    for (char **at = environ; *at; at++)
        if (!utf8(*at))
            return RESIDENT_NOT_TAKEN;
    if (!(kept = environment_kept()))
        return RESIDENT_NOT_TAKEN;
    if ((sock = connect_helper()) < 0) {
        free(kept);
        return RESIDENT_NOT_TAKEN;
    }
    mask = umask(022);
    umask(mask);
    if ((cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 || !(buffer = malloc(MAX_MESSAGE))) {
        if (cwd >= 0)
            close(cwd);
        close(sock);
        free(kept);
        return RESIDENT_NOT_TAKEN;
    }
    fds[3] = cwd;

    put_call(&call, &(struct call){.identity = identity, .own = own, .argc = argc, .argv = argv, .kept = kept,
                                   .mask = mask, .delegate = delegate, .hook = hook});
    free(kept);

    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout); /* a stopped or hung helper: ours */
    taken = send_message(sock, &call, fds, MAX_FDS) && receive_message(sock, buffer, &answer, fds, &count);
    free(call.data);
    close(cwd);
    if (taken) {
        close_all(fds, count);
        taken = is_text(&answer.items[0], "worker") && answer.length == 2 && answer.items[1].kind == INT &&
                answer.items[1].number > 0;
        worker_pid = taken ? (sig_atomic_t)answer.items[1].number : 0;
        free_value(&answer);
    }
    if (!taken) { /* ("local", why): the helper cannot work this call in our place */
        free(buffer);
        close(sock);
        return RESIDENT_NOT_TAKEN;
    }
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    forward_signals(forward);
    status = serve(sock, buffer);
    free(buffer);
    close(sock);
    if (status >= 0)
        return status;
    worker_pid = 0; /* the worker's PID is nobody's, or soon another's: not one more signal to it */
    forward_signals(SIG_DFL);
    wait_for_children();
    return RESIDENT_WORKER_GONE;
}
