"""Every file format a checkpoint is made of, as models plus readers and writers: the GPU
manifest, the OCI spec, the archive (podman's layout, its compressed stream), OCI image layouts, the tar stream, CRIU's
image files and the signature envelope."""
