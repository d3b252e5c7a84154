"""Every file format gpuckpt reads or writes: config, manifest, archives."""
