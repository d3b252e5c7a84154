"""Checkpoints moving between nodes: export and import machinery (the operator's bounds, page
staging, the read around the page cache) and the signatures checked on what arrives."""
