/* The compiled launcher's call of gpuckpt-runtimed (shim/resident/resident_call.c). */
#ifndef GPUCKPT_RESIDENT_CALL_H
#define GPUCKPT_RESIDENT_CALL_H

#define RESIDENT_NOT_TAKEN (-1)   /* nothing was done: the Python shim works the verb */
#define RESIDENT_WORKER_GONE (-2) /* the worker ended before the verb did: one error line, exit 1 */

/* The verb's exit status as the helper's worker worked it, or one of the two above. `site` holds the gpuckpt
 * package whose helper may work it; argv[1..] are the runtime's arguments; delegate and hook the resolved ones. */
int call_resident(const char *site, const char *own, int argc, char **argv, const char *delegate, const char *hook);

#endif
