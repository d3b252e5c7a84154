"""The node config: defaults, validation messages that name file, key and allowed values."""

import pytest
from support import write_config

from gpuckpt.errors import ConfigError
from gpuckpt.node.config import Config, load_config


def test_no_file_gives_defaults(node) -> None:
    assert load_config() == Config()
    assert load_config().delegate == "runc"


def test_allow_unrestorable_takes_never_and_bools(node) -> None:
    write_config(node, '[cuda]\nallow_unrestorable = "never"\n[criu]\ncontainer_config_dirs = ["/etc/criu", '
                       '"/srv/criu"]\n')
    config = load_config()
    assert config.cuda.allow_unrestorable == "never" and config.criu.container_config_dirs == ("/etc/criu", "/srv/criu")
    write_config(node, '[cuda]\nallow_unrestorable = true\n')
    assert load_config().cuda.allow_unrestorable is True


def test_valid_file(node) -> None:
    write_config(node, 'delegate = "crun"\n[cuda]\nlock_timeout_ms = 500\ndriver_version_policy = "equal"\n')
    config = load_config()
    assert config.delegate == "crun" and config.cuda.lock_timeout_ms == 500


@pytest.mark.parametrize("text, expected", [
    ('delegat = "crun"\n', "unknown key 'delegat' (allowed: delegate, cuda, criu"),
    ('[cuda]\nlock_timeout = 5\n', "unknown key 'cuda.lock_timeout' (allowed: lock_timeout_ms"),
    ('[cuda]\ndriver_version_policy = "any"\n', "cuda.driver_version_policy = 'any': should be 'equal' or "
                                                "'same-major'"),
    ('[cuda]\nlock_timeout_ms = 0\n', "cuda.lock_timeout_ms = 0: should be a number >= 1"),
    # a key of two types (issue 33): one line naming the key, the value and both types, no pydantic locations
    ('[import]\nmax_staged_bytes = "lots"\n', "import.max_staged_bytes = 'lots': should be 'auto' or a valid integer"),
    ('[import]\nmax_staged_bytes = -1\n', "import.max_staged_bytes = -1: should be 'auto' or a number >= 0"),
    ('delegate = "bin/runc"\n', "must be a program name looked up on PATH"),
    ('delegate = \n', "not valid TOML"),
    ('[criu]\ncontainer_config_dirs = ["etc/criu"]\n', "criu.container_config_dirs = ['etc/criu']: 'etc/criu' is "
                                                       "not an absolute"),
    ('[criu]\ncontainer_config_dirs = ["/"]\n', "normalised directory other than /"),
    ('[cuda]\nallow_unrestorable = "sometimes"\n', "cuda.allow_unrestorable = 'sometimes': should be False, "
                                                   "True or 'never'"),
])
def test_errors_name_file_key_and_allowed(node, text: str, expected: str) -> None:
    path = write_config(node, text)
    with pytest.raises(ConfigError) as raised:
        load_config()
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and expected in message
    assert "\n" not in message
