"""runc's command line as the shim sees it: global flags, the verb, the verb's flags.

Parsing is read-only: the argv reaches the delegate unchanged unless a verb
module adds options of its own. Anything unknown is left for the delegate to judge.

Plain classes, not dataclasses: this is on every container operation's start-up
path, and `dataclasses` costs ~14 ms to import.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs start-up time on every container operation
if TYPE_CHECKING:
    from collections.abc import Sequence

# runc's global flags (main.go) that take a value, and crun's two more; the others are booleans.
GLOBAL_VALUE_FLAGS = frozenset({"log", "log-format", "root", "criu", "rootless", "cgroup-manager", "log-level"})
GLOBAL_BOOL_FLAGS = frozenset({"debug", "systemd-cgroup", "help", "h", "version", "v"})
# Those of them that ask for help or the version instead of a verb's work (runc answers `runc --help checkpoint ID`).
ASKING_FLAGS = frozenset({"help", "h", "version", "v"})

# The verbs the shim works itself (shim/main.py); the rest reach the delegate unchanged.
OWNED_VERBS = frozenset({"checkpoint", "restore", "pause", "resume", "delete"})

# Value-taking flags of the verbs the shim owns (runc checkpoint.go, restore.go).
CHECKPOINT_VALUE_FLAGS = frozenset(
    {"image-path", "work-path", "parent-path", "status-fd", "page-server",
     "manage-cgroups-mode", "empty-ns"}
)
RESTORE_VALUE_FLAGS = frozenset(
    {"console-socket", "image-path", "work-path", "manage-cgroups-mode", "bundle", "b",
     "pid-file", "empty-ns", "lsm-profile", "lsm-mount-context"}
)

# Their boolean flags (runc 1.1-1.3, crun): with the value flags, what a prefix is checked against (below).
CHECKPOINT_BOOL_FLAGS = frozenset(
    {"leave-running", "tcp-established", "tcp-skip-in-flight", "skip-in-flight", "ext-unix-sk", "shell-job",
     "lazy-pages", "file-locks", "pre-dump", "auto-dedup", "link-remap", "help", "h"}
)
RESTORE_BOOL_FLAGS = frozenset(
    {"tcp-established", "tcp-skip-in-flight", "ext-unix-sk", "shell-job", "file-locks", "detach", "d",
     "no-subreaper", "no-pivot", "auto-dedup", "lazy-pages", "help", "h"}
)

# The owned verbs whose flags the shim reads, by verb (the others' flags take no value).
# The compiled launcher's copies are generated from these tables (shim/resident/contract.py).
OWNED_VALUE_FLAGS = {"checkpoint": CHECKPOINT_VALUE_FLAGS, "restore": RESTORE_VALUE_FLAGS}
OWNED_BOOL_FLAGS = {"checkpoint": CHECKPOINT_BOOL_FLAGS, "restore": RESTORE_BOOL_FLAGS}

# What Go's strconv.ParseBool reads as false (runc's boolean flags, `--leave-running=F`).
GO_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})


def _split_flag(arg: str) -> tuple[str, str | None]:
    """'--root=/x' -> ('root', '/x'); '-debug' -> ('debug', None) (urfave/cli takes both dashes)."""
    name = arg.lstrip("-")
    if "=" in name:
        name, value = name.split("=", 1)
        return name, value
    return name, None


class RuntimeArgs:
    """The global part of a runc command line and where the verb starts."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv  # everything after the program name, unchanged
        self.globals_: dict[str, str] = {}
        self.command_index: int | None = None  # index in argv of the verb, None if none
        self.unknown_global: str | None = None  # a global flag runc does not have

    @property
    def global_argv(self) -> list[str]:
        """The global flags as given, for the shim's own calls of the delegate."""
        end = self.command_index if self.command_index is not None else len(self.argv)
        return self.argv[:end]

    @property
    def command(self) -> str | None:
        return None if self.command_index is None else self.argv[self.command_index]

    @property
    def command_args(self) -> list[str]:
        return [] if self.command_index is None else self.argv[self.command_index + 1:]

    @property
    def log_path(self) -> str | None:
        return self.globals_.get("log") or None

    @property
    def log_format(self) -> str:
        return self.globals_.get("log-format", "text")

    @property
    def debug(self) -> bool:
        return self.globals_.get("debug", "false") not in GO_FALSE

    @property
    def wants_version(self) -> bool:
        return "version" in self.globals_ or "v" in self.globals_

    def runtime_root(self, delegate: str) -> str:
        """The delegate's state directory for this call, absolute, as it keys its containers: --root resolved
        (relative to the working directory, a trailing slash or a link making no other root), else the
        delegate's default (runc, crun: /run/NAME as root, $XDG_RUNTIME_DIR/NAME rootless)."""
        given = self.globals_.get("root")
        if given:
            return os.path.realpath(given)
        runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "") if os.geteuid() != 0 else ""
        return os.path.realpath(os.path.join(runtime_dir or "/run", os.path.basename(delegate)))


def parse_runtime_args(argv: list[str]) -> RuntimeArgs:
    """Find runc's global flags and the verb in argv (program name excluded)."""
    parsed = RuntimeArgs(argv=argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-":
            parsed.command_index = i
            return parsed
        name, value = _split_flag(arg)
        if name in GLOBAL_VALUE_FLAGS:
            if value is None:
                i += 1
                value = argv[i] if i < len(argv) else ""
            parsed.globals_[name] = value
        elif name in GLOBAL_BOOL_FLAGS:
            parsed.globals_[name] = value if value is not None else "true"
        else:
            # Whether it takes a value is unknown: leave the rest to the delegate.
            parsed.unknown_global = arg
            return parsed
        i += 1
    return parsed


class VerbArgs:
    """A verb's flags (name -> values, last one wins for scalars) and positionals."""

    def __init__(self, flags: dict[str, list[str]], positionals: list[str]) -> None:
        self.flags = flags
        self.positionals = positionals

    def value(self, *names: str) -> str | None:
        for name in names:
            if self.flags.get(name):
                return self.flags[name][-1]
        return None

    def has(self, name: str) -> bool:
        values = self.flags.get(name)
        return values is not None and len(values) > 0 and values[-1] not in GO_FALSE

    @property
    def container_id(self) -> str | None:
        return self.positionals[0] if self.positionals else None


# runc options crun does not have and that change nothing in the way engines call them:
# containerd passes -no-subreaper to restore --detach, where runc has no child to reap.
CRUN_DROPPED = frozenset({"no-subreaper"})


def for_delegate(delegate: str, args: RuntimeArgs, argv: list[str]) -> list[str]:
    """The owned verb's argv in the delegate's dialect. runc (urfave/cli) takes long options
    with one dash too ("-no-subreaper"); crun's parser reads those as short-option clusters."""
    if "crun" not in os.path.basename(delegate):
        return argv
    at = (args.command_index or 0) + 1
    verb_args: list[str] = []
    for index in range(at, len(argv)):
        arg = argv[index]
        if arg == "--":
            verb_args.extend(argv[index:])
            break
        if arg.startswith("-") and not arg.startswith("--") and len(arg.split("=", 1)[0]) > 2:
            arg = "-" + arg
        if arg.startswith("--") and arg[2:].split("=", 1)[0] in CRUN_DROPPED:
            continue
        verb_args.append(arg)
    return [*argv[:at], *verb_args]


def delegate_argv(delegate: str, args: RuntimeArgs, options: Sequence[str] = ()) -> list[str]:
    """What an owned verb runs the delegate with: the caller's argv, `options` added right after
    the verb, in the delegate's dialect (for_delegate)."""
    at = (args.command_index or 0) + 1
    return for_delegate(delegate, args, [*args.argv[:at], *options, *args.argv[at:]])


def image_path_given(verb: VerbArgs) -> str:
    """--image-path as the engine gave it (the delegate gets it so), or runc's default ./checkpoint."""
    return verb.value("image-path") or "checkpoint"


def image_dir_of(verb: VerbArgs) -> str:
    """Where checkpoint images are, absolute (a '..' in it is refused first: host/safefiles.py)."""
    return os.path.abspath(image_path_given(verb))


def parse_verb_args(args: list[str], value_flags: frozenset[str]) -> VerbArgs:
    """Split a verb's arguments into flags and positionals, as urfave/cli does."""
    flags: dict[str, list[str]] = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positionals.extend(args[i + 1:])
            break
        if arg.startswith("-") and arg != "-":
            name, value = _split_flag(arg)
            if value is None:
                if name in value_flags:
                    i += 1
                    value = args[i] if i < len(args) else ""
                else:
                    value = "true"
            flags.setdefault(name, []).append(value)
        else:
            positionals.append(arg)
        i += 1
    return VerbArgs(flags=flags, positionals=positionals)


def hidden_checkpoint_or_restore(args: RuntimeArgs) -> str | None:
    """A command line with a global flag the shim does not know (crun also takes abbreviations: --roo)
    that may be a checkpoint or restore: it would reach the delegate past the shim's checks. The line
    refusing it, or None."""
    if args.unknown_global is None or not {"checkpoint", "restore"} & set(args.argv):
        return None
    known = ", ".join(f"--{name}" for name in sorted(GLOBAL_VALUE_FLAGS | GLOBAL_BOOL_FLAGS) if len(name) > 1)
    return (f"gpuckpt-runtime: global option {args.unknown_global[:64]!r} is not one it knows (allowed, in full: "
            f"{known}): a checkpoint or restore is not passed to the delegate unchecked")


def owned_verb_is_only_asked_about(args: RuntimeArgs) -> bool:
    """An owned verb called for its help, or without a container: the delegate's own answer is all there
    is. Engines ask `checkpoint --help` before each checkpoint and restore (podman, for the flags it may
    pass): the shim must not load the verb's machinery for it. A --help counts before the container only:
    crun reads a verb's options up to its container and checkpoints `checkpoint ID --help` (runc prints its
    help either way)."""
    if any(args.globals_.get(name, "false") not in GO_FALSE for name in ASKING_FLAGS):
        return True  # runc answers `runc --help checkpoint ID` with its help and checkpoints nothing
    flags = OWNED_VALUE_FLAGS.get(args.command or "", frozenset())
    verb = parse_verb_args(args.command_args, flags)
    if verb.container_id is None:
        return True
    before = parse_verb_args(args.command_args[:_container_index(args.command_args, flags)], flags)
    return before.has("help") or before.has("h")


def _container_index(verb_args: list[str], value_flags: frozenset[str]) -> int:
    """Where the first positional (the container) is in a verb's arguments; len() if none."""
    i = 0
    while i < len(verb_args):
        arg = verb_args[i]
        if arg == "--":
            return i
        if not arg.startswith("-") or arg == "-":
            return i
        name, value = _split_flag(arg)
        i += 2 if value is None and name in value_flags else 1
    return len(verb_args)


def ambiguous_owned_call(args: RuntimeArgs) -> str | None:
    """Why a checkpoint or restore's arguments could mean one thing to the shim and another to the delegate, or
    None. The shim checks the images, bundle and options it reads; the delegate must act on the same ones:
    crun reads options up to the container only and takes prefixes of long options (`--bund=X` is its
    --bundle), and `-b=X` is "=X" to it. No engine writes any of these."""
    if args.command not in OWNED_VALUE_FLAGS:
        return None
    value_flags, bool_flags = OWNED_VALUE_FLAGS[args.command], OWNED_BOOL_FLAGS[args.command]
    verb_args = args.command_args
    options_end = at = _container_index(verb_args, value_flags)
    if verb_args[at:at + 1] == ["--"]:
        at += 1
    if len(verb_args) > at + 1:
        return (f"gpuckpt-runtime {args.command}: {verb_args[at + 1][:64]!r} after the container: options go "
                "before the container ID, which comes last")
    known = value_flags | bool_flags
    options = iter(verb_args[:options_end])
    for arg in options:
        name, value = _split_flag(arg)
        if value is None and name in value_flags:
            next(options, None)  # its value, whatever it looks like
        if not arg.startswith("--") and len(name) == 1 and value is not None:
            return (f"gpuckpt-runtime {args.command}: {arg[:64]!r}: give a one-letter option's value as its "
                    "next argument")
        if name not in known and any(flag.startswith(name) for flag in known):
            return (f"gpuckpt-runtime {args.command}: option {arg[:64]!r} is a prefix of another: give options "
                    "in full")
    return None
