/* The compiled launcher's serving loop (shim/resident/resident_call.c) on an inherited socket, for
 * tests/test_resident.py's `served` fixture: argv[1] is the fd; the exit status is the worker's word. */
#include "../../shim/resident/resident_call.c"

int main(int argc, char **argv)
{
    unsigned char *buffer = malloc(MAX_MESSAGE);
    int status;
    if (argc != 2 || !buffer)
        return 2;
    status = serve(atoi(argv[1]), buffer);
    return status < 0 ? 255 : status;
}
