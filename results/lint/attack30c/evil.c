/* attack30c: preloaded into the host program a hook runs; writes who ran it, then gets out of the way. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void attack30c(void) {
    unsetenv("LD_PRELOAD");
    FILE *f = fopen("/var/tmp/attack30c/preload-ran", "a");
    if (f) { fprintf(f, "uid=%d euid=%d pid=%d\n", getuid(), geteuid(), getpid()); fclose(f); }
}
