"""conf/: every file composes and validates; overrides work; bad settings name the key."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from runs import ROOT

from mlmkit.config import Config, register_configs, to_config
from mlmkit.errors import ConfigError

CONF = ROOT / "conf"
OTHER_GROUPS = {"accelerate", "task"}  # groups of other configs than the training one
OTHER_PRIMARY = (
    "evaluate",
    "finetune",
    "eval_sts",
    "glue",
    "eval_retrieval",
    "eval_pairs",
    "embed",
    "scorecard",
)  # conf/<name>.yaml besides config.yaml, each tested below
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in OTHER_GROUPS)


def _compose(overrides):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_the_schemas_are_stored_once_per_process():
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from mlmkit.config import EvalConfig

    register_configs()
    repo = ConfigStore.instance().repo
    first = repo["mlmkit_schema.yaml"]
    register_configs()
    assert repo["mlmkit_schema.yaml"] is first  # not stored again
    ConfigStore.instance().store(
        name="mlmkit_schema", node=EvalConfig
    )  # another schema under the name
    register_configs()
    assert OmegaConf.get_type(repo["mlmkit_schema.yaml"].node) is Config


def _group_options():
    for group in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            yield group, path.stem


@pytest.mark.parametrize("group,option", list(_group_options()))
def test_every_group_option_composes_and_validates(group, option):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "files":
        overrides.append("data.train_files=[a.txt]")
    cfg = to_config(_compose(overrides))
    assert isinstance(cfg, Config)


def test_every_conf_file_is_covered():
    """A new YAML file anywhere under conf/ must be reachable by the test above."""
    covered = {CONF / "config.yaml"} | {CONF / g / f"{o}.yaml" for g, o in _group_options()}
    covered |= {CONF / f"{name}.yaml" for name in OTHER_PRIMARY}
    covered |= {CONF / "task" / f"{t}.yaml" for t in (*TASKS, "files", *TOKEN_TASKS, "qa")}
    present = {p for p in CONF.rglob("*.yaml") if "accelerate" not in p.parts}  # tested elsewhere
    assert present == covered


def test_evaluate_config_composes_and_validates():
    from mlmkit.config import EvalConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="evaluate",
            overrides=["checkpoint=x", "data=files", "data.train_files=[a.txt]"],
        )
    ev = to_config(cfg, EvalConfig)
    assert ev.checkpoint == "x" and ev.data.train_files == ["a.txt"]
    assert ev.masking.eval_seed == Config().masking.eval_seed  # the masks training evaluates with
    with pytest.raises(ConfigError, match="checkpoint="):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            to_config(compose(config_name="evaluate"), EvalConfig)


def test_glue_config_composes_and_validates():
    from mlmkit.config import GlueConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="glue", overrides=["checkpoint=x", "protocol=modern", "seeds=[0,1]"]
        )
    glue = to_config(cfg, GlueConfig)
    assert glue.tasks == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]
    assert glue.protocol == "modern" and glue.seeds == [0, 1] and glue.lrs is None
    for bad, message in (
        (["protocol=roberta"], "protocol must be one of bert, modern"),
        (["lrs=[]"], "lrs must list positive"),
        ([], "checkpoint="),
    ):
        with pytest.raises(ConfigError, match=message):
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                overrides = bad if bad == [] else ["checkpoint=x", *bad]
                to_config(compose(config_name="glue", overrides=overrides), GlueConfig)


def test_scorecard_config_composes_and_validates():
    from mlmkit.config import ScorecardConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="scorecard",
            overrides=["models=[a,b]", "own_tasks=[{name: mine, task: files}]", "seeds=5"],
        )
    card = to_config(cfg, ScorecardConfig)
    assert card.models == ["a", "b"] and card.suite == "fast" and card.seeds == 5
    assert card.own_tasks == [{"name": "mine", "task": "files"}] and card.bootstrap == 1000
    for bad, message in (
        (["seeds=0"], "seeds must be at least 1"),
        (["bootstrap=10"], "bootstrap must be at least 100"),
        (["confidence=1.0"], "confidence must be in"),
        (["precision=fp8"], "precision"),
    ):
        with pytest.raises(ConfigError, match=message):
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                to_config(compose(config_name="scorecard", overrides=bad), ScorecardConfig)


@pytest.mark.parametrize(
    "name,layers,hidden,heads",
    [
        ("bert-tiny", 2, 128, 2),
        ("bert-mini", 4, 256, 4),
        ("bert-small", 4, 512, 8),
        ("bert-medium", 8, 512, 8),
        ("bert-base", 12, 768, 12),
        ("bert-large", 24, 1024, 16),
    ],
)
def test_model_presets(name, layers, hidden, heads):
    m = to_config(_compose([f"model={name}"])).model
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads) == (layers, hidden, heads)
    assert m.intermediate_size == 4 * hidden


def test_command_line_overrides():
    cfg = to_config(_compose(["model=bert-mini", "optim.lr=5e-4", "train.max_steps=200"]))
    assert cfg.model.hidden_size == 256 and cfg.optim.lr == 5e-4 and cfg.train.max_steps == 200


def test_misspelt_key_is_refused_by_name():
    with pytest.raises(Exception) as info:
        _compose(["optim.lrr=0.1"])
    assert "lrr" in str(info.value)


def test_wrong_type_is_refused_by_name():
    with pytest.raises(Exception) as info:
        _compose(["train.max_steps=many"])
    assert "max_steps" in str(info.value)


@pytest.mark.parametrize(
    "override,key",
    [
        ("masking.mlm_probability=1.5", "masking.mlm_probability"),
        ("masking.mlm_probability=0", "masking.mlm_probability"),
        (
            "masking.random_replace_prob=0.5",
            "masking.mask_replace_prob + masking.random_replace_prob",
        ),
        ("train.batch_size=0", "train.batch_size"),
        ("train.precision=fp8", "train.precision"),
        ("model.num_attention_heads=3", "model.num_attention_heads"),
        ("data.max_seq_length=1024", "data.max_seq_length"),
        ("optim.schedule=step", "optim.schedule"),
        ("model.output_bias_init=prior", "model.output_bias_init"),
        ("model.attention_init=global", "model.attention_init"),
        ("model.position_init=normal", "model.attention_init=normal"),
        ("tokenizer.extend_vocab=100", "set model.init_from, or tokenizer.extend_vocab=0"),
        ("tokenizer.extend_vocab=-1", "tokenizer.extend_vocab must be 0 or more"),
        ("masking.max_word_tokens=0", "masking.max_word_tokens"),
    ],
)
def test_bad_values_name_the_setting(override, key):
    with pytest.raises(ConfigError) as info:
        to_config(_compose([override]))
    assert key in str(info.value)


@pytest.mark.parametrize(
    "overrides,sentence",
    [
        (["objective.generator_size=1.0"], "makes a generator as wide as the model or wider"),
        (
            ["model.hidden_size=32", "objective.generator_size=0.99"],
            "makes a generator 32 wide, as wide as model.hidden_size (32)",
        ),
        (["model=modernbert-tiny"], "objective=rtd trains a BERT discriminator"),
        (["model.sparse_prediction=false"], "set model.sparse_prediction=true"),
        (["objective.discriminator_weight=0"], "objective.discriminator_weight must be positive"),
    ],
)
def test_replaced_token_detection_refuses_what_it_cannot_follow_in_one_sentence(
    overrides, sentence
):
    from mlmkit.config import compose as compose_run

    with pytest.raises(ConfigError) as info:
        compose_run(["objective=rtd", *overrides])
    message = str(info.value)
    assert sentence in message and message.count(". ") == 0 and message.endswith(".")


def test_replaced_token_detection_composes_with_the_generator_of_the_paper():
    from mlmkit.config import compose as compose_run

    cfg = compose_run(["objective=rtd", "model=bert-mini"])  # short for objective.name=rtd
    assert (cfg.objective.name, cfg.objective.discriminator_weight) == ("rtd", 50.0)
    # ELECTRA-small's generator: a quarter of the width, heads and FFN (hidden 256 -> 64)
    assert cfg.objective.generator_shape(256, 4, 1024) == (64, 1, 256)
    assert to_config(_compose([])).objective.name == "mlm"  # the default
    electra = compose_run(["recipe=electra"])  # ELECTRA-Small's published recipe
    assert (electra.model.name, electra.model.num_hidden_layers, electra.model.hidden_size) == (
        "electra-small",
        12,
        256,
    )
    assert (electra.objective.name, electra.objective.generator_size) == ("rtd", 0.25)
    assert (electra.optim.lr, electra.optim.warmup_steps, electra.optim.beta2) == (
        5e-4,
        10000,
        0.999,
    )
    assert (electra.train.global_batch_size, electra.train.max_steps) == (128, 1_000_000)
    m = electra.masking
    assert (m.mlm_probability, m.mask_replace_prob, m.random_replace_prob) == (0.15, 0.85, 0.0)
    assert electra.model.hidden_dropout_prob == 0.1 and electra.data.max_seq_length == 128


def test_init_settings_of_a_new_model_do_not_bind_continued_pretraining():
    """The starts of a new model are not checked against each other when model.init_from
    brings its own weights."""
    cfg = to_config(_compose(["model.position_init=normal", "model.init_from=some/bert"]))
    assert cfg.model.attention_init == "local" and cfg.model.init_from == "some/bert"


def test_files_source_requires_train_files():
    with pytest.raises(ConfigError, match="data.train_files"):
        to_config(_compose(["data=files", "data.train_files=[]"]))


def test_launch_time_is_shared_by_ranks_of_one_launcher():
    """Ranks started by one launcher at different moments name the same run dir."""
    import os
    import subprocess
    import sys
    import time

    code = "from mlmkit.config import launch_time; print(launch_time('%Y-%m-%d/%H-%M-%S'))"
    env = {**os.environ, "LOCAL_RANK": "0"}
    first = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    time.sleep(1.2)
    second = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert first.stdout == second.stdout  # both report this (parent) process's start
    alone = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v for k, v in env.items() if k != "LOCAL_RANK"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert alone.stdout != first.stdout  # outside a launcher: now


def test_presets_carry_a_learning_rate_that_falls_with_size():
    names = ["bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base", "bert-large"]
    lrs = [to_config(_compose([f"model={n}"])).optim.lr for n in names]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] > lrs[-1]
    assert to_config(_compose(["model=bert-base", "optim.lr=1e-4"])).optim.lr == 1e-4
    assert to_config(_compose(["optim.lr=2e-3", "model=bert-base"])).optim.lr == 2e-3


TASKS = ("sst2", "cola", "rte", "stsb", "mrpc", "qqp", "mnli", "mnli_mm", "qnli", "wnli")
TOKEN_TASKS = ("ner", "pos", "tokens")


@pytest.mark.parametrize("task", TASKS)
def test_finetune_config_composes_for_every_task(task):
    from mlmkit.config import FinetuneConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="finetune", overrides=["checkpoint=x", f"task={task}"])
    ft = to_config(cfg, FinetuneConfig)
    assert ft.task.name == task and ft.task.hub_name == task.removesuffix(
        "_mm"
    )  # mnli's other dev set
    assert ("matthews_correlation" in ft.task.metrics) == (task == "cola")
    assert ("f1" in ft.task.metrics) == (task in ("mrpc", "qqp"))
    assert (ft.task.kind == "regression") == (task == "stsb")


def test_finetune_config_composes_for_own_files():
    from mlmkit.config import FinetuneConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        files = ["checkpoint=x", "task=files", "task.train_file=a.csv", "task.eval_file=b.jsonl"]
        cfg = compose(config_name="finetune", overrides=files)
        regression = compose(config_name="finetune", overrides=[*files, "task.kind=regression"])
        missing = compose(config_name="finetune", overrides=["checkpoint=x", "task=files"])
    ft = to_config(cfg, FinetuneConfig)
    assert ft.task.hub_path is None and ft.task.labels == [] and ft.task.metrics == ["accuracy"]
    assert ft.pooling == "mean" and ft.save_model  # the defaults of conf/finetune.yaml
    assert to_config(regression, FinetuneConfig).task.metrics == ["spearman", "pearson"]
    with pytest.raises(ConfigError, match="task.train_file=<file> and task.eval_file=<file>"):
        to_config(missing, FinetuneConfig)


@pytest.mark.parametrize("task", TOKEN_TASKS)
def test_finetune_config_composes_for_every_token_task(task):
    from mlmkit.config import FinetuneConfig

    register_configs()
    GlobalHydra.instance().clear()
    train = ["task.train_file=a.conll"] if task == "tokens" else []
    files = [*train, "task.eval_file=b.conll"] if task == "tokens" else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="finetune", overrides=["checkpoint=x", f"task={task}", *files])
        share = compose(
            config_name="finetune",
            overrides=[
                "checkpoint=x",
                f"task={task}",
                *train,
                "task.eval_file=null",
                "task.eval_share=0.2",
            ],
        )
        no_eval = compose(
            config_name="finetune",
            overrides=["checkpoint=x", f"task={task}", "task.eval_file=null"],
        )
        bad = compose(
            config_name="finetune",
            overrides=["checkpoint=x", f"task={task}", *files, "task.metrics=[exact]"],
        )
    ft = to_config(cfg, FinetuneConfig)
    assert ft.task.kind == "tokens" and ft.task.hub_path is None and ft.task.labels == []
    assert ft.task.metrics == {"ner": ["f1", "accuracy"], "pos": ["accuracy"], "tokens": []}[task]
    assert to_config(share, FinetuneConfig).task.eval_share == 0.2
    with pytest.raises(
        ConfigError, match=r"task.eval_file=<file> \(.conll or .conllu\), or task.eval_share"
    ):
        to_config(no_eval, FinetuneConfig)
    with pytest.raises(ConfigError, match="task.metrics: 'exact' does not score task.kind=tokens"):
        to_config(bad, FinetuneConfig)


def test_finetune_config_composes_for_question_answering():
    from mlmkit.config import FinetuneConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="finetune", overrides=["checkpoint=x", "task=qa"])
        bad = [
            compose(config_name="finetune", overrides=["checkpoint=x", "task=qa", override])
            for override in ("task.metrics=[accuracy]", "task.doc_stride=-1", "task.n_best=0")
        ]
    ft = to_config(cfg, FinetuneConfig)
    assert ft.task.kind == "qa" and ft.task.metrics == ["f1", "exact"]
    assert ft.task.doc_stride == 32 and not ft.task.tune_null_threshold
    for composed, match in zip(bad, ("does not score task.kind=qa", "doc_stride", "n_best")):
        with pytest.raises(ConfigError, match=match):
            to_config(composed, FinetuneConfig)


def test_eval_sts_config_composes_and_validates():
    from mlmkit.config import StsEvalConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="eval_sts", overrides=["checkpoint=x", "pooling=cls"])
    sts = to_config(cfg, StsEvalConfig)
    assert sts.checkpoint == "x" and sts.pooling == "cls"


def test_eval_retrieval_config_composes_and_validates():
    from mlmkit.config import RetrievalEvalConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="eval_retrieval", overrides=["checkpoint=x", "data_dir=beir/scifact"]
        )
        bad = compose(
            config_name="eval_retrieval", overrides=["checkpoint=x", "data_dir=d", "pooling=max"]
        )
        no_data = compose(config_name="eval_retrieval", overrides=["checkpoint=x"])
    ev = to_config(cfg, RetrievalEvalConfig)
    assert ev.checkpoint == "x" and ev.data_dir == "beir/scifact"
    # the defaults of conf/eval_retrieval.yaml: BEIR's test judgments, final/'s mean pooling and
    # length
    assert (ev.split, ev.pooling, ev.max_seq_length, ev.init) == (
        "test",
        "mean",
        None,
        "pretrained",
    )
    with pytest.raises(ConfigError, match="pooling must be cls or mean"):
        to_config(bad, RetrievalEvalConfig)
    with pytest.raises(ConfigError, match="data_dir="):
        to_config(no_data, RetrievalEvalConfig)


def test_eval_pairs_config_composes_and_validates():
    from mlmkit.config import PairsEvalConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="eval_pairs",
            overrides=["checkpoint=x", "files=[blimp/anaphor_gender_agreement.jsonl,pairs.tsv]"],
        )
        bad = compose(
            config_name="eval_pairs", overrides=["checkpoint=x", "files=[a.jsonl]", "batch_size=0"]
        )
        no_files = compose(config_name="eval_pairs", overrides=["checkpoint=x"])
    ev = to_config(cfg, PairsEvalConfig)
    assert ev.checkpoint == "x" and ev.files == [
        "blimp/anaphor_gender_agreement.jsonl",
        "pairs.tsv",
    ]
    # the defaults of conf/eval_pairs.yaml: BLiMP's field names
    assert (ev.good_field, ev.bad_field, ev.init) == ("sentence_good", "sentence_bad", "pretrained")
    assert (ev.max_seq_length, ev.batch_size, ev.output) == (128, 512, None)
    with pytest.raises(ConfigError, match="batch_size must be at least 1"):
        to_config(bad, PairsEvalConfig)
    with pytest.raises(ConfigError, match=r"files=\[a.jsonl,b.tsv\]"):
        to_config(no_files, PairsEvalConfig)


@pytest.mark.parametrize(
    "name,layers,hidden,heads,intermediate",
    [
        ("modernbert-tiny", 3, 128, 2, 192),
        ("modernbert-mini", 6, 256, 4, 384),
        ("modernbert-base", 22, 768, 12, 1152),
        ("modernbert-large", 28, 1024, 16, 2624),
    ],
)
def test_modernbert_presets(name, layers, hidden, heads, intermediate):
    m = to_config(_compose([f"model={name}"])).model
    assert m.architecture == "modernbert" and m.name == name
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.intermediate_size) == (
        layers,
        hidden,
        heads,
        intermediate,
    )
    assert (m.local_attention, m.global_attn_every_n_layers, m.layer_norm_eps) == (128, 3, 1e-5)
    assert (
        to_config(_compose(["model=bert-base"])).model.architecture == "bert"
    )  # BERT stays the default
    assert to_config(_compose([])).model.architecture == "bert"


def test_dataloader_workers_default_to_two_on_a_gpu_and_none_on_a_cpu():
    """train.num_workers=null: on CUDA two workers mask beside the step (masking in the training
    process would hold the GPU up); on a CPU none (the step uses its cores); 0 wherever a
    mask-rate schedule masks in the dataloader; a number set is kept."""
    from mlmkit.config import MaskingConfig, TrainConfig

    assert Config().train.num_workers is None
    assert (Config().workers("cuda"), Config().workers("cpu")) == (2, 0)
    schedule = MaskingConfig(mlm_probability=0.3, mlm_probability_end=0.15)
    assert Config(masking=schedule).workers("cuda") == 0
    assert (
        Config(
            masking=MaskingConfig(mlm_probability=0.3, mlm_probability_end=0.15, on_device=True)
        ).workers("cuda")
        == 2
    )
    assert Config(train=TrainConfig(num_workers=3)).workers("cpu") == 3


def test_embed_config_composes_and_validates():
    from mlmkit.config import EmbedConfig

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="embed",
            overrides=["checkpoint=x", "pairs.files=[p.jsonl]", "sts_dir=STS-B"],
        )
        simcse = compose(
            config_name="embed",
            overrides=[
                "checkpoint=x",
                "objective=simcse",
                "data=files",
                "data.train_files=[a.txt]",
            ],
        )
        bad = compose(
            config_name="embed", overrides=["checkpoint=x", "objective=simcse", "loss=triplet"]
        )
    embed = to_config(cfg, EmbedConfig)
    # the defaults of conf/embed.yaml: in-batch negatives, the model's own dropout, STS-B's layout
    assert (embed.objective, embed.loss, embed.dropout, embed.overlap) == (
        "pairs",
        "mnrl",
        None,
        "drop",
    )
    assert embed.task.name == "stsb" and embed.task.data_dir == "STS-B"
    assert to_config(simcse, EmbedConfig).data.train_files == ["a.txt"]
    with pytest.raises(ConfigError, match="loss must be one of mnrl, cached_mnrl"):
        to_config(bad, EmbedConfig)
