/*
 * gpuckpt-runtime's launcher: the pass-through without an interpreter.
 *
 * Engines call the runtime for every container operation (`state` all the time); a Python
 * interpreter's start alone costs ~10 ms of that. This program decides what shim/main.py would
 * decide for a call it passes through unchanged, from the same delegate cache (shim/resolve.py
 * writes it), and becomes the delegate. Anything else, or any doubt (no cache entry, a global
 * option it does not know, --version, an owned verb with a container), it hands to the Python
 * shim, with its own path as argv[0] as the shim would have seen it (and the engine's argv[0], whose name may choose
 * the delegate: shim/resolve.py delegate_named). An owned verb goes to the resident helper first where one listens
 * (shim/resident/resident_call.c), as the shim would send it.
 *
 * Built by shim/resident/build.sh with the interpreter and site-packages of the installation; the tables and names it
 * shares with the Python side are generated from that side's (shim/resident/contract.py: resident_contract.h).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "resident_call.h"
#include "resident_contract.h"

#if !defined(GPUCKPT_PYTHON) || !defined(GPUCKPT_SITE)
#error "build with -DGPUCKPT_PYTHON=\"...\" -DGPUCKPT_SITE=\"...\" (shim/resident/build.sh)"
#endif

/* shim/argv.py's tables (resident_contract.h, generated from them) */
static const char *const GLOBAL_VALUE_FLAGS[] = ARGV_GLOBAL_VALUE_FLAGS;
static const char *const GLOBAL_BOOL_FLAGS[] = ARGV_GLOBAL_BOOL_FLAGS;
static const char *const ASKING_FLAGS[] = ARGV_ASKING_FLAGS;
static const char *const GO_FALSE[] = ARGV_GO_FALSE;
static const struct owned_verb {
    const char *name;
    const char *const *value_flags; /* its flags that take a value */
} OWNED_VERBS[] = ARGV_OWNED_VERBS;

/* shim/resolve.py's cache */
#define CACHE_VERSION RESOLVE_CACHE_VERSION
#define CACHE_NAME RESOLVE_CACHE_NAME
#define CACHE_FIELDS 8 /* version, config path, config identity, PATH, launcher, name, delegate, hook */
static const char *const DELEGATE_NAMES[] = RESOLVE_DELEGATE_NAMES;
#define CACHE_MAX 65536

/* the engine's argv[0] (whose name may choose the delegate), then ours, which takes -c's place */
#define SHIM_PRELUDE "import sys\n"                                                                         \
                     "called_as = sys.argv[1]\n"                                                              \
                     "sys.argv[:3] = sys.argv[2:3]\n"                                                         \
                     "sys.path.insert(0, \"" GPUCKPT_SITE "\")\n"
static const char SHIM_CODE[] = SHIM_PRELUDE "from gpuckpt.shim.main import main\n"
                                             "sys.exit(main(called_as=called_as))\n";
/* after the helper did not take the call: asking it again would only wait for the same answer */
static const char SHIM_CODE_LOCAL[] = SHIM_PRELUDE "from gpuckpt.shim.main import main\n"
                                                   "sys.exit(main(resident=False, called_as=called_as))\n";
/* after the helper's worker ended before the verb: shim/resident/call.py's line, where the shim says its errors */
static const char SHIM_CODE_WORKER_GONE[] = SHIM_PRELUDE "from gpuckpt.shim.resident.call import report_worker_gone\n"
                                                         "sys.exit(report_worker_gone(sys.argv[1:]))\n";

static int member(const char *const *set, const char *name, size_t length)
{
    for (; *set; set++)
        if (strlen(*set) == length && strncmp(*set, name, length) == 0)
            return 1;
    return 0;
}

/* "--root=/x" -> name "root" (length 4), value "/x"; "-debug" -> "debug", no value (urfave/cli takes both) */
static void split_flag(const char *arg, const char **name, size_t *length, const char **value)
{
    const char *equals;
    while (*arg == '-')
        arg++;
    equals = strchr(arg, '=');
    *name = arg;
    *length = equals ? (size_t)(equals - arg) : strlen(arg);
    *value = equals ? equals + 1 : NULL;
}

static int is_false(const char *value)
{
    return member(GO_FALSE, value, strlen(value));
}

static int asks_help(const char *help, const char *h)
{
    return (help && !is_false(help)) || (h && !is_false(h));
}

/* shim/argv.py's owned_verb_is_only_asked_about past the globals: --help/-h, or no container named. And a
 * --help only before the container: crun parses a verb's options in order and stops at the container, so
 * `crun checkpoint ID --help` checkpoints ID (runc moves the flag forward and only prints its help). */
static int only_asked_about(int argc, char **argv, int verb_at, const char *const *value_flags)
{
    const char *help = NULL, *h = NULL;
    int positionals = 0, asked_before_container = 0;
    for (int i = verb_at + 1; i < argc; i++) {
        const char *arg = argv[i], *name, *value;
        size_t length;
        if (strcmp(arg, "--") == 0 || arg[0] != '-' || strcmp(arg, "-") == 0) {
            if (!positionals)
                asked_before_container = asks_help(help, h);
            if (strcmp(arg, "--") == 0) {
                positionals += argc - i - 1;
                break;
            }
            positionals++;
            continue;
        }
        split_flag(arg, &name, &length, &value);
        if (!value)
            value = member(value_flags, name, length) ? (++i < argc ? argv[i] : "") : "true";
        if (length == 4 && strncmp(name, "help", 4) == 0)
            help = value;
        else if (length == 1 && name[0] == 'h')
            h = value;
    }
    if (positionals == 0)
        return 1;
    return asks_help(help, h) && asked_before_container; /* the shim's answer, and crun's */
}

/* The verb's index past the global options this file knows; 0 for `--`, a --help or --version, an option it does not
 * know, or no verb: the shim judges those (a checkpoint behind an unknown option is refused). */
static int verb_index(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *name, *value;
        size_t length;
        if (strcmp(arg, "--") == 0)
            return 0;
        if (arg[0] != '-' || strcmp(arg, "-") == 0)
            return i;
        split_flag(arg, &name, &length, &value);
        if (member(ASKING_FLAGS, name, length))
            return 0; /* --version and --help are the shim's to answer */
        if (member(GLOBAL_VALUE_FLAGS, name, length)) {
            if (!value)
                i++;
        } else if (!member(GLOBAL_BOOL_FLAGS, name, length)) {
            return 0;
        }
    }
    return 0;
}

static const struct owned_verb *owned_verb(const char *name)
{
    for (const struct owned_verb *verb = OWNED_VERBS; verb->name; verb++)
        if (strcmp(verb->name, name) == 0)
            return verb;
    return NULL;
}

/* Whether the shim would work this call itself, or hand it to the resident helper: an owned verb with a
 * container and not only asked about, every global option known, none asking for help or the version
 * (shim/main.py's test; the worker checks it again). 0 too for a call the shim must judge. */
static int owned_call(int argc, char **argv)
{
    int i = verb_index(argc, argv);
    const struct owned_verb *verb = i ? owned_verb(argv[i]) : NULL;
    return verb && !only_asked_about(argc, argv, i, verb->value_flags);
}

/* The verb's index when this call goes to the delegate unchanged, whatever the config's hook; 0 when the shim
 * must see it. Sets *create when it passes through only if the config adds no hook, *delete when only if
 * delete_passes_through says so (a delete, asked about or not, is the shim's otherwise). */
static int passes_through(int argc, char **argv, int *create, int *delete)
{
    int i = verb_index(argc, argv);
    if (!i)
        return 0;
    *delete = strcmp(argv[i], "delete") == 0;
    if (!*delete && owned_call(argc, argv))
        return 0;
    *create = strcmp(argv[i], "create") == 0;
    return i;
}

static const char *env_or(const char *name, const char *fallback)
{
    const char *value = getenv(name);
    return value && *value ? value : fallback;
}

/* Whether the state directory has a lock file of this ID under any runtime root (node/lock.py names them
 * ID@DIGEST.lock, DIGEST the root's; ID.lock before roots counted). Any will do: the shim's delete then works out
 * which one is this root's; a lock file of the ID under another root only costs the shim's start. */
static int has_lock_file(const char *container)
{
    const char *state = env_or(PATHS_STATE_DIR_ENV, PATHS_DEFAULT_STATE_DIR);
    char locks[PATH_MAX], legacy[NAME_MAX + 1];
    size_t length = strlen(container);
    struct dirent *entry;
    DIR *directory;
    int found = 0;
    if ((size_t)snprintf(locks, sizeof locks, "%s/locks", state) >= sizeof locks ||
        (size_t)snprintf(legacy, sizeof legacy, "%s.lock", container) >= sizeof legacy)
        return 1; /* a name no lock could have: the shim says what is wrong */
    if (!(directory = opendir(locks)))
        return errno != ENOENT;
    while (!found && (entry = readdir(directory)))
        found = strcmp(entry->d_name, legacy) == 0 ||
                (strncmp(entry->d_name, container, length) == 0 &&
                 (entry->d_name[length] == '@' || entry->d_name[length] == '~'));
    closedir(directory);
    return found;
}

/* shim/delete.py adds two things to the delegate's delete: it removes the container's lock file (node/lock.py),
 * and where the delegate fails for a container it does not have, it says "does not exist" as runc does
 * (containerd reads those words; crun says "No such file or directory"). With runc and no lock file there is
 * nothing to add: the delete is runc's alone. */
static int delete_passes_through(int argc, char **argv, int verb_at, const char *delegate)
{
    const char *container = NULL, *base = strrchr(delegate, '/');
    for (int i = verb_at + 1; i < argc && !container; i++) {
        if (strcmp(argv[i], "--") == 0)
            container = i + 1 < argc ? argv[i + 1] : NULL;
        else if (argv[i][0] != '-' || strcmp(argv[i], "-") == 0)
            container = argv[i];
    } /* delete's flags (--force, -f) take no value */
    if (!container || !*container || strchr(container, '/') || strcmp(container, ".") == 0 ||
        strcmp(container, "..") == 0 || strcmp(base ? base + 1 : delegate, "runc") != 0)
        return 0;
    return !has_lock_file(container);
}

/* shim/resolve.py's delegate_named: argv[0]'s last component where it names a delegate, else "" */
static const char *delegate_named(const char *called_as)
{
    const char *name = strrchr(called_as, '/');
    name = name ? name + 1 : called_as;
    return member(DELEGATE_NAMES, name, strlen(name)) ? name : "";
}

/* The delegate and hook shim/resolve.py cached for this config, PATH, launcher and name; 0 when there is none. */
static int cached_delegate(const char *own, const char *named, char *delegate, size_t delegate_size, char *hook,
                           size_t hook_size)
{
    const char *config = env_or(PATHS_CONFIG_PATH_ENV, PATHS_DEFAULT_CONFIG_PATH);
    const char *path = getenv("PATH") ? getenv("PATH") : "";
    char identity[128], name[PATH_MAX], key[3 * PATH_MAX + NAME_MAX + 64], content[CACHE_MAX + 1];
    const char *fields[CACHE_FIELDS + 1];
    struct stat status;
    size_t key_length;
    ssize_t length = 0, got;
    int fd, count = 0;

    if (stat(config, &status) == 0)
        snprintf(identity, sizeof identity, "%llu:%llu:%lld:%lld:%lld", (unsigned long long)status.st_dev,
                 (unsigned long long)status.st_ino, (long long)status.st_size,
                 (long long)status.st_mtim.tv_sec * 1000000000LL + status.st_mtim.tv_nsec,
                 (long long)status.st_ctim.tv_sec * 1000000000LL + status.st_ctim.tv_nsec);
    else
        return 0; /* absent or unreadable: the shim says what is wrong */

    /* the file's name: crc32 of the key without the config's identity (which is inside the file) */
    key_length = (size_t)snprintf(key, sizeof key, "%s%c%s%c%s%c%s%c%s", CACHE_VERSION, 0, config, 0, path, 0, own,
                                  0, named);
    if (key_length >= sizeof key)
        return 0;
    if ((size_t)snprintf(name, sizeof name, "%s/%s.%08lx", env_or(PATHS_STATE_DIR_ENV, PATHS_DEFAULT_STATE_DIR),
                         CACHE_NAME, crc32(0L, (const Bytef *)key, (uInt)key_length)) >= sizeof name)
        return 0;

    fd = open(name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK); /* a FIFO there must not hang us */
    if (fd < 0)
        return 0;
    /* only a cache written by us and writable by nobody else */
    if (fstat(fd, &status) != 0 || status.st_uid != geteuid() || (status.st_mode & 022) || !S_ISREG(status.st_mode)) {
        close(fd);
        return 0;
    }
    while (length < CACHE_MAX && (got = read(fd, content + length, (size_t)(CACHE_MAX - length))) > 0)
        length += got;
    close(fd);
    if (got < 0 || length == CACHE_MAX)
        return 0; /* a file this long was cut: its last fields (the hook) may be missing */
    content[length] = '\0';

    for (const char *at = content; at <= content + length && count <= CACHE_FIELDS; at += strlen(at) + 1)
        fields[count++] = at;
    if (count != CACHE_FIELDS)
        return 0;
    if (strcmp(fields[0], CACHE_VERSION) || strcmp(fields[1], config) || strcmp(fields[2], identity) ||
        strcmp(fields[3], path) || strcmp(fields[4], own) || strcmp(fields[5], named))
        return 0;
    if (fields[6][0] != '/' || access(fields[6], X_OK) != 0 || strlen(fields[6]) >= delegate_size ||
        strlen(fields[7]) >= hook_size)
        return 0;
    strcpy(delegate, fields[6]);
    strcpy(hook, fields[7]);
    return 1;
}

static void exec_shim(int argc, char **argv, const char *own, const char *code)
{
    char **shim_argv = calloc((size_t)(argc > 0 ? argc : 1) + 6, sizeof *shim_argv); /* and the NULL */
    if (!shim_argv)
        exit(1);
    shim_argv[0] = GPUCKPT_PYTHON;
    shim_argv[1] = "-IS";
    shim_argv[2] = "-c";
    shim_argv[3] = (char *)code;
    shim_argv[4] = argc > 0 ? argv[0] : "";
    shim_argv[5] = (char *)own;
    for (int i = 1; i < argc; i++)
        shim_argv[5 + i] = argv[i];
    execv(GPUCKPT_PYTHON, shim_argv);
    fprintf(stderr, "gpuckpt-runtime: cannot run %s: %s\n", GPUCKPT_PYTHON, strerror(errno));
    exit(1);
}

int main(int argc, char **argv)
{
    char own[PATH_MAX], delegate[PATH_MAX], hook[PATH_MAX];
    int create = 0, delete = 0, verb_at, cached, status;

    if (!realpath("/proc/self/exe", own))
        snprintf(own, sizeof own, "%s", argc > 0 ? argv[0] : "");
    if (argc < 1)
        exec_shim(argc, argv, own, SHIM_CODE);
    cached = cached_delegate(own, delegate_named(argv[0]), delegate, sizeof delegate, hook, sizeof hook);

    if (cached && (verb_at = passes_through(argc, argv, &create, &delete)) && !(create && hook[0]) &&
        !(delete && !delete_passes_through(argc, argv, verb_at, delegate))) {
        argv[0] = delegate;
        execv(delegate, argv);
        /* gone or not executable since: the shim reports it */
    } else if (cached && owned_call(argc, argv) && !(getenv(CALL_RESIDENT_ENV) &&
                                                     strcmp(getenv(CALL_RESIDENT_ENV), "0") == 0)) {
        status = call_resident(GPUCKPT_SITE, own, argc, argv, delegate, hook);
        if (status == RESIDENT_NOT_TAKEN)
            exec_shim(argc, argv, own, SHIM_CODE_LOCAL);
        if (status == RESIDENT_WORKER_GONE)
            exec_shim(argc, argv, own, SHIM_CODE_WORKER_GONE);
        return status;
    }
    exec_shim(argc, argv, own, SHIM_CODE);
}
