"""The node's deduplicating checkpoint store: content-defined chunks written once, checkpoints as manifests.

`chunking` cuts a file's bytes into content-defined chunks and names each by its BLAKE3 digest;
`repository` is the store on disk (its lock, chunk files, checkpoint manifests); `writer` puts a
podman export stream into it; `reader` gives a stored checkpoint back as that stream, every chunk
verified; `retention` removes checkpoints and collects the chunks nothing references.
"""
