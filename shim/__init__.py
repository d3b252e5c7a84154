"""The OCI runtime shim: runc's command line in front of runc or crun."""
