"""Checkpoints moving between nodes: the operator's bounds on what an import may take, and the staging of its
pages beside the image directory."""
