"""``pai-zoo rl``: the registered RL trainers, each a subcommand with the flags it declares.

    pai-zoo rl list                      every trainer (core and plugins) with its description
    pai-zoo rl NAME [FLAGS]              run trainer NAME (``pai-zoo rl NAME --help`` for its flags)
    pai-zoo rl run NAME [FLAGS]          the same

A trainer's flags come from its :meth:`~pai_zoo.rl.RLTrainer.add_arguments` (their defaults are its
settings' defaults); the parsed values are its settings. ``--config FILE.yaml`` gives settings from YAML as
``pai-zoo train CONFIG.yaml`` does: each key a flag's name without ``--`` (``num-generations`` or
``num_generations``); a flag given on the command line with a value other than its default wins. The summary
``run()`` returns is printed as JSON.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..models.handle import resolve
from ..models.tokenizer_fit import check_tokenizer_fit
from ..plugin.errors import PaiZooError, SettingError
from ..rl import list_trainers
from ..training.save_dir import check_save_dir, cleanup_on_failure
from ..util.dist import is_rank0
from ..util.hub import hub_paths
from ..util.trackers import TRACKER_FLAGS, TrackerSettings, add_tracker_arguments, tracking
from ..util.yaml_settings import read_settings_yaml
from ._checks import RULES, check_trainer_inputs, check_value
from ._common import add_command, add_revision, registry

RESERVED = ("list", "run")  # subcommands of ``rl`` that a trainer's name cannot shadow
#: A trainer's settings that name a model folder: each one's tokenizer is checked against its config before it loads.
MODEL_SETTINGS = ("model", "actor", "critic", "ref_model", "reference", "reward", "reward_model")


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "rl", "RL trainers: rl list | rl NAME [flags] (ppo, reward, plugins')")
    try:
        trainers = list_trainers()
    except PaiZooError as exc:  # a broken plugin trainer breaks ``rl`` only, not the other commands
        p.add_argument("rl_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(func=_raiser(exc))
        return
    names = "{list,run," + ",".join(sorted(n for n in trainers if n not in RESERVED)) + "}"
    rsub = p.add_subparsers(dest="rl_command", required=True, metavar=names)
    add_command(rsub, "list", "every registered trainer with its description").set_defaults(func=run_list)
    _add_trainers(rsub, {n: cls for n, cls in trainers.items() if n not in RESERVED})
    q = add_command(rsub, "run", "run trainer NAME, the same as `pai-zoo rl NAME`")
    _add_trainers(q.add_subparsers(dest="rl_trainer", required=True, metavar="NAME"), trainers)


def _add_trainers(subparsers, trainers: dict) -> None:
    for name in sorted(trainers):
        cls = trainers[name]
        q = add_command(subparsers, name, cls.description or f"the {name} trainer")
        before = {a.dest for a in q._actions}
        cls.add_arguments(q)
        _show_defaults(q)
        own = [a for a in q._actions if a.dest not in before]
        required = [a for a in own if a.required and a.option_strings]
        for action in required:  # they may come from --config instead
            action.required = False
        q.add_argument("--config", metavar="FILE.yaml", help="settings from a YAML mapping (keys: the flags' names "
                       "without --); flags given here with other values than their defaults win")
        if "--force" not in q._option_string_actions:
            q.add_argument("--force", dest="rl_force", action="store_true",
                           help="write into a --save folder that holds files other than a pai-zoo run (they are kept)")
        if "--tokenizer-mismatch-ok" not in q._option_string_actions:
            q.add_argument("--tokenizer-mismatch-ok", dest="rl_tokenizer_mismatch_ok", action="store_true",
                           help="go on with a model whose tokenizer does not fit its config (another model's "
                                "vocabulary or special-token ids), which is refused otherwise")
        names = {name: a for a in own for name in (a.dest, *(o.lstrip("-") for o in a.option_strings))}
        if "--revision" not in q._option_string_actions:  # the Hub ids among the model flags: their revision
            add_revision(q, "a model flag")
            names["revision"] = q._option_string_actions["--revision"]
        add_tracker_arguments(q, skip={d for d, (flag, _) in TRACKER_FLAGS.items() if flag in q._option_string_actions})
        for dest, (flag, _) in TRACKER_FLAGS.items():  # --config keys too: tensorboard_dir or tensorboard-dir
            names.setdefault(dest, q._option_string_actions[flag])
            names.setdefault(flag.lstrip("-"), q._option_string_actions[flag])
        q.set_defaults(func=run_trainer, rl_class=cls, rl_settings=tuple(a.dest for a in own), rl_names=names,
                       rl_required=tuple(required), rl_name=name, rl_parser=q)


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """``--help`` shows every flag's default, also of flags a trainer declared without help text (argparse
    prints nothing for those)."""
    for action in parser._actions:
        if action.option_strings and action.help is None and action.default is not None \
                and not isinstance(action.default, bool) and action.default is not argparse.SUPPRESS:
            action.help = "default: %(default)s"


def _raiser(exc: PaiZooError):
    def run(args) -> int:
        raise exc

    return run


def run_list(args) -> int:
    trainers = list_trainers()
    if not trainers:
        print("no RL trainers registered")
        return 0
    width = max(len(n) for n in trainers)
    for name in sorted(trainers):
        cls = trainers[name]
        print(f"{name:<{width}}  {cls.__module__}.{cls.__qualname__}  {cls.description}".rstrip())
    return 0


def _trackers(args, settings: dict) -> TrackerSettings:
    """``--tensorboard-dir`` and the W&B flags (or their --config keys), unless the trainer declares them itself:
    taken out of the trainer's settings and checked."""
    mine = [d for d in TRACKER_FLAGS if d not in args.rl_settings]
    given = {d: settings.pop(d) for d in mine if d in settings}
    given.update({d: getattr(args, d) for d in mine if getattr(args, d, None) is not None})
    tracked = TrackerSettings.from_mapping(given)
    tracked.check()
    return tracked


def run_trainer(args) -> int:
    settings = {dest: getattr(args, dest) for dest in args.rl_settings if hasattr(args, dest)}
    if args.config:
        given = read_settings_yaml(args.config, SettingError, "the --config YAML file of settings")
        for key, value in given.items():
            action = args.rl_names.get(key) or args.rl_names.get(key.replace("_", "-"))
            if action is None:
                known = ", ".join(sorted({a.option_strings[0].lstrip("-") for a in args.rl_names.values()
                                          if a.option_strings}))
                raise SettingError(f"{args.config}: {key!r} is no setting of `pai-zoo rl {args.rl_name}`; "
                                   f"the settings: {known}")
            if settings.get(action.dest) == action.default:  # not given on the command line
                if action.type in (int, float) and isinstance(value, str):  # YAML reads 1e-5 as a string
                    try:
                        value = action.type(value)
                    except ValueError:
                        raise SettingError(f"{args.config}: {key} {value}: not a valid {action.type.__name__}") \
                            from None
                if action.dest in RULES:  # the flags' rules (_checks.RULES), named as the file spells the key
                    check_value(RULES[action.dest], value, f"{args.config}: {key}", action.dest)
                settings[action.dest] = value
    missing = [a.option_strings[0] for a in args.rl_required if settings.get(a.dest) in (None, "")]
    if missing:  # argparse's usage error (exit 2), as before --config existed
        args.rl_parser.error(f"the following arguments are required: {', '.join(missing)} (on the command line or "
                             "in --config FILE.yaml)")
    flags = {a.dest: a.option_strings[0] for a in args.rl_names.values() if a.option_strings}
    if "revision" not in args.rl_settings:  # Hub ids among the models: their snapshots in the Hugging Face cache
        revision = args.revision if args.revision is not None else settings.pop("revision", None)
        settings.pop("revision", None)
        dests = [d for d in MODEL_SETTINGS if isinstance(settings.get(d), str) and settings[d]
                 and not settings[d].startswith("rule:")]
        for dest, path in zip(dests, hub_paths(revision, *(settings[d] for d in dests), flag="--revision ")):
            settings[dest] = str(path)
    tracked = _trackers(args, settings)  # TensorBoard and W&B: the packages they need, before anything loads
    check_trainer_inputs(settings, flags, registry())  # the models and files named, before anything is read
    for dest in MODEL_SETTINGS:  # a model folder holding another model's tokenizer: refused before it loads
        value = settings.get(dest)
        if isinstance(value, str) and value and Path(value).is_dir():
            try:
                source = resolve(value)
            except PaiZooError:  # not a model folder (a LoRA run ...): the trainer says what it takes
                continue
            check_tokenizer_fit(source, ok=getattr(args, "rl_tokenizer_mismatch_ok", False), where=value)
    save = settings.get("save")
    if isinstance(save, str) and save:  # before any model loads; a failed run leaves no --save folder it created
        check_save_dir(save, force=getattr(args, "rl_force", False))
        created = not Path(save).exists()
    try:
        with tracking(tracked, loss=f"{args.rl_name} loss", config={**settings, "trainer": args.rl_name}):
            summary = args.rl_class(**settings).run()  # every MetricsLog it writes also goes to the trackers
    except BaseException:
        if isinstance(save, str) and save and is_rank0():
            cleanup_on_failure(save, created)
        raise
    print(json.dumps(summary, indent=2, default=str))
    return 0

