"""Every file format a checkpoint is made of, as models plus readers and writers: the GPU manifest, the OCI
spec, the archive (podman's layout, its compressed stream), OCI image layouts, the tar stream and CRIU's image
files. Formats import nothing above host/ (pyproject.toml's import contracts)."""
