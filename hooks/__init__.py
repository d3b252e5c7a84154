"""OCI hooks shipped with gpuckpt."""
