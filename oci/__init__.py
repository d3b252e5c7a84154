"""Every file format a checkpoint is made of, as models plus readers and writers: the GPU
manifest, the OCI spec, archives (ours and podman's), OCI image layouts, the tar stream, CRIU's
image files and the signature envelope."""
