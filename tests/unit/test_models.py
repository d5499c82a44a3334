"""Reference models at real size: registry, torchvision shim, offline data, step factory, CLI."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from models import bert, gpt2, text
from models.data import load_dataset
from models.registry import build_config, build_model, model_kind, model_names
from models.resnet import forward_macs
from models.zoo import resolve_factory, split_batch, step_factory, task_loss
from tests.integration.launch_helpers import REPO, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ["mlp", "resnet50", "resnext101", "bert-large", "gpt2"]


def _env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def test_registry_lists_every_model():
    """Every reference model is registered and has a debug flavour."""
    assert set(MODELS) <= set(model_names())
    for name in MODELS:
        assert build_config(name, "debug") is not None


def test_torchvision_shim_in_fresh_process():
    """import_torchvision works after a failed plain import, is idempotent, and nms is correct and fake-traceable."""
    code = textwrap.dedent(
        """
        import torch
        try:
            import torchvision  # may fail: CUDA-built wheel on CPU torch
            plain = True
        except Exception:
            plain = False
        from models._torchvision import import_torchvision, nms_reference
        tv = import_torchvision()
        assert import_torchvision() is tv
        assert tv.models.resnet50 is not None
        b = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 9, 9.0]])
        s = torch.tensor([0.9, 0.8, 0.7, 0.95])
        assert tv.ops.nms(b, s, 0.5).tolist() == [3, 2]
        assert tv.ops.batched_nms(b, s, torch.tensor([0, 1, 0, 0]), 0.5).tolist() == [3, 1, 2]
        assert nms_reference(b, s, 0.99).tolist() == [3, 0, 1, 2]
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        with FakeTensorMode(shape_env=ShapeEnv()):
            assert torch.ops.torchvision.nms(torch.rand(5, 4), torch.rand(5), 0.5).dim() == 1
        print("OK", plain, tv.extension._has_ops())
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK" in r.stdout


@pytest.mark.parametrize("name", MODELS)
def test_debug_flavour_trains_on_real_data(name):
    """The debug flavour runs fwd+bwd on a batch of 2 from its own dataset; the loss is finite."""
    kind = model_kind(name, "debug")
    train, _ = load_dataset(kind.dataset, seed=0, image_size=kind.image_size, seq_len=kind.seq_len,
                            vocab_size=kind.vocab_size)
    batch = [torch.stack([train[i][j] for i in range(2)]) for j in range(len(train[0]))]
    torch.manual_seed(0)
    model = build_model(name, "debug")
    inputs, targets = split_batch(kind.task, batch)
    loss = task_loss(kind.task, model(*inputs), targets)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_full_size_models_trace_under_fake_tensor_mode():
    """Every model at full size runs one fwd+bwd under FakeTensorMode with no real storage."""
    for name in MODELS:
        with FakeTensorMode():
            model, inputs, loss_fn = step_factory(name, batch_size=2)
            loss = loss_fn(model(*inputs))
            loss.backward()
        params = list(model.parameters())
        assert all(isinstance(p, FakeTensor) for p in params), name
        assert all(isinstance(p.grad, FakeTensor) for p in params), name
        assert loss.shape == ()


def test_full_size_parameter_counts():
    """Parameter counts match the published / independently computed figures."""
    with FakeTensorMode():
        counts = {n: sum(p.numel() for p in build_model(n).parameters()) for n in MODELS[1:]}
    assert counts["resnet50"] == 25_557_032
    assert counts["resnext101"] == 44_177_704  # ResNeXt-101 32x4d
    assert counts["gpt2"] == gpt2.param_count(build_config("gpt2")) == 124_439_808
    assert counts["bert-large"] == bert.param_count(build_config("bert-large")) == 336_226_108


def test_tied_embeddings_are_kept():
    """GPT-2's LM head and BERT's MLM decoder share the word-embedding parameter."""
    with FakeTensorMode():
        g = build_model("gpt2", "debug")
        b = build_model("bert-large", "debug")
    assert g.lm_head.weight is g.wte.weight
    assert b.model.cls.predictions.decoder.weight is b.model.bert.embeddings.word_embeddings.weight


def test_analytic_flops():
    """ResNet-50 forward is 4.09 G MACs at 224 px; transformer estimates follow 6N per token."""
    assert forward_macs(build_config("resnet50")) == pytest.approx(4.09e9, rel=0.01)
    cfg = build_config("gpt2")
    assert cfg.training_flops(1, seq_len=1024) == pytest.approx(6 * 124e6 * 1024 + 12 * 12 * 768 * 1024**2, rel=0.05)
    assert build_config("bert-large").training_flops(2, seq_len=128) > 0
    assert build_config("mlp").training_flops(3) == 6 * (64 * 128 + 128 * 128 + 128 * 10) * 3


def test_model_kinds():
    """Kinds carry the dataset, sizes and vocab the CLI and tracer need."""
    assert model_kind("resnet50").image_size == 224 and model_kind("resnet50", "debug").image_size == 32
    k = model_kind("bert-large")
    assert (k.kind, k.task, k.dataset, k.vocab_size, k.max_positions) == ("text", "mlm-nsp", "text-mlm", 30522, 512)
    assert model_kind("gpt2").dataset == "text-lm" and model_kind("mlp").dataset == "digits"


def test_step_factory_validates_sizes():
    """Bad sizes raise ValueError naming the problem."""
    with pytest.raises(ValueError, match="max_positions"):
        step_factory("gpt2", "debug", batch_size=2, seq_len=129)
    with pytest.raises(ValueError, match="batch_size"):
        step_factory("gpt2", "debug", batch_size=0)
    with pytest.raises(ValueError, match="image_size does not apply"):
        step_factory("gpt2", "debug", batch_size=1, image_size=32)
    with pytest.raises(ValueError, match="no setting"):
        step_factory("resnet50", "debug", batch_size=1, hidden=3)


def test_resolve_factory_registered_and_user():
    """A registered name (with flavour) and a package.module:factory both resolve."""
    model, inputs, loss_fn = resolve_factory("gpt2:debug", seq_len=16)(2)
    assert inputs[0].shape == (2, 16)
    assert torch.isfinite(loss_fn(model(*inputs)))
    model, inputs, loss_fn = resolve_factory("tests.unit.model_factory_helper:factory")(3)
    assert torch.isfinite(loss_fn(model(*inputs)))
    model, _, _ = resolve_factory("tests.unit.model_factory_helper:factory", width=6)(3)
    assert model.out_features == 6


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no-such-model", "registered: .*bert-large.*gpt2.*mlp.*resnet50.*resnext101"),
        ("gpt2:huge", "no flavour"),
        ("tests.unit.no_such_module:factory", "cannot import module"),
        ("tests.unit.model_factory_helper:missing", "no attribute"),
        ("tests.unit.model_factory_helper:NOT_CALLABLE", "not a callable"),
        ("", "non-empty"),
        ("tests.unit.model_factory_helper:builder", "model builder \\(its first parameter is 'weights'\\)"),
        ("torchvision.models.detection:fasterrcnn_resnet50_fpn", "model builder"),  # not a classifier
    ],
)
def test_resolve_factory_bad_specs(spec, match):
    """Bad specs raise ValueError with an actionable message."""
    with pytest.raises(ValueError, match=match):
        resolve_factory(spec)


def test_a_factory_that_returns_something_else_is_named():
    with pytest.raises(ValueError, match=r"returned Linear; it must return \(model, inputs, loss_fn\)"):
        resolve_factory("tests.unit.model_factory_helper:returns_a_module")(2)
    model, inputs, _ = resolve_factory("tests.unit.model_factory_helper:bare_input")(3)  # one tensor, untupled
    assert len(inputs) == 1 and inputs[0].shape == (3, 8)
    # a size flag the factory has no parameter for is named before any work (not a TypeError at the call)
    with pytest.raises(ValueError, match=r"cannot be called as factory\(batch_size, seq_len=8\).*\(batch_size, width\)"):
        resolve_factory("tests.unit.model_factory_helper:factory", seq_len=8)


def test_torchvision_classifiers_resolve_untrained_at_their_weights_crop(monkeypatch):
    """'torchvision.models:NAME' builds the classifier with weights=None (nothing downloaded),
    random images at the crop its default weights are evaluated at (or --image-size) and the
    cross entropy of its logits (the main ones where training also returns auxiliary logits)."""
    import torch.hub

    def no_download(*_a, **_k):
        raise AssertionError("nothing may be downloaded")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    torch.manual_seed(0)
    model, (x,), loss_fn = resolve_factory("torchvision.models:mobilenet_v3_small")(2)
    assert x.shape == (2, 3, 224, 224) and model.classifier[-1].out_features == 1000
    assert torch.isfinite(loss_fn(model(x)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # init_weights is passed: torchvision does not warn
        _, (x,), _ = resolve_factory("torchvision.models:inception_v3")(1)
        assert x.shape == (1, 3, 299, 299)  # Inception_V3_Weights.DEFAULT's crop
        model, (x,), loss_fn = resolve_factory("torchvision.models:googlenet", image_size=96)(2)
    out = model(x)
    assert x.shape[-1] == 96 and hasattr(out, "aux_logits1")  # GoogLeNetOutputs in training mode
    assert torch.equal(loss_fn(out), loss_fn(out.logits))  # the main logits, not the auxiliary ones
    model, (x,), loss_fn = resolve_factory("torchvision.models:vit_b_16", image_size=64)(1)
    assert model.image_size == 64 and torch.isfinite(loss_fn(model(x)))  # a ViT is built for the size
    with pytest.raises(ValueError, match="seq_len does not apply"):
        resolve_factory("torchvision.models:resnet18", seq_len=8)(1)
    with pytest.raises(ValueError, match="image_size must be >= 32"):
        resolve_factory("torchvision.models:resnet18", image_size=16)(1)


def test_text_corpus_and_tokenizer():
    """The offline corpus is real English of > 50 KB; tokens are deterministic and in range."""
    corpus = text.corpus_text()
    assert len(corpus) > 50_000 and " the " in corpus
    a, b = text.encode(corpus, 30522), text.encode(corpus, 30522)
    assert torch.equal(a, b) and int(a.min()) >= text.OFFSET and int(a.max()) < 260
    small = text.encode(corpus, 100)
    assert int(small.max()) < 100
    tr1, te1 = load_dataset("text-mlm", seed=3, seq_len=32, vocab_size=512)
    tr2, _ = load_dataset("text-mlm", seed=3, seq_len=32, vocab_size=512)
    assert all(torch.equal(x, y) for x, y in zip(tr1.tensors, tr2.tensors))
    ids, types, attention, mlm, nsp = tr1.tensors
    assert (ids[:, 0] == text.CLS).all() and ((mlm != -100).sum(1) >= 1).all()
    assert set(nsp.unique().tolist()) == {0, 1} and len(te1) > 0
    x, y = load_dataset("text-lm", seed=0, seq_len=64, vocab_size=50257)[0].tensors
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_digits_images():
    """Digits resized to the model's size, 3 channels, labels 0-9."""
    train, test = load_dataset("digits-images", seed=0, image_size=40)
    x, y = train[0]
    assert x.shape == (3, 40, 40) and x.dtype == torch.float32 and 0 <= int(y) <= 9
    assert len(train) + len(test) == 1797




@pytest.mark.parametrize("model, key", [("resnet50", "test_accuracy"), ("gpt2", "test_perplexity")])
def test_train_cli_end_to_end(model, key, tmp_path):
    """python -m models.train runs two steps of a debug vision and text model over hccl (world 1)."""
    summary = tmp_path / "s.json"
    env = _env() | {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = subprocess.run(
        [sys.executable, "-m", "models.train", "--model", model, "--flavour", "debug", "--max-steps", "2",
         "--epochs", "1", "--eval-samples", "8", "--summary", str(summary)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    final = json.loads(summary.read_text())["final"]
    assert key in final and final["train_loss"] == final["train_loss"]


def test_train_cli_rejects_bad_values():
    """Unknown models and bad sizes are refused with the accepted values."""
    from models.train import main

    with pytest.raises(ValueError, match="unknown model 'no-such-model'; registered: bert-large"):
        main(["--model", "no-such-model"])
    with pytest.raises(ValueError, match="--flavour"):
        main(["--model", "mlp:debug"])
    with pytest.raises(ValueError, match="--dataset applies to registered models"):
        main(["--model", "tests.unit.model_factory_helper:factory", "--dataset", "digits"])
    with pytest.raises(ValueError, match="max_positions"):
        main(["--model", "gpt2", "--flavour", "debug", "--seq-len", "4096"])
    with pytest.raises(ValueError, match="seq_len does not apply"):
        main(["--model", "resnet50", "--seq-len", "8"])
    with pytest.raises(ValueError, match="trains on dataset"):
        main(["--model", "resnet50", "--flavour", "debug", "--dataset", "digits"])


def test_digits_split_is_sklearns_and_a_later_process_reads_it_without_importing_sklearn(tmp_path, monkeypatch):
    """NOTE [digits split cache]: the split is scikit-learn's stratified ``train_test_split`` of
    ``load_digits`` (computed here as the reference); a second process reads it from the cache
    and imports no scikit-learn, nor does the text corpus; a torn or malformed file is made
    again; ``HPU_EMULATOR_DATA_CACHE=0`` writes nothing."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from models import data

    digits = load_digits()
    x, y = (digits.data.astype(np.float32) / 16.0).reshape(-1, 64), digits.target.astype(np.int64)
    ref = train_test_split(x, y, test_size=0.25, random_state=7, stratify=y)

    def same(got) -> bool:
        return all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, ref, strict=True))

    cache = tmp_path / "cache"
    monkeypatch.setenv(data.DATA_CACHE_ENV, str(cache))
    assert same(data._digits_arrays(0.25, 7))
    (path,) = cache.iterdir()
    code = textwrap.dedent("""
        import json, sys
        from models.data import load_dataset
        from models import text
        train, test = load_dataset("digits", test_fraction=0.25, seed=7)
        corpus = text.corpus_text()
        print(json.dumps({"sklearn": "sklearn" in sys.modules, "sums": [float(train.tensors[0].double().sum()),
              int(train.tensors[1].sum()), float(test.tensors[0].double().sum()), int(test.tensors[1].sum())],
              "corpus": len(corpus)}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, data.DATA_CACHE_ENV: str(cache)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sklearn"] is False and out["corpus"] == len(text.corpus_text())
    assert out["sums"] == [float(ref[0].astype(np.float64).sum()), int(ref[2].sum()),
                           float(ref[1].astype(np.float64).sum()), int(ref[3].sum())]
    path.write_bytes(path.read_bytes()[:1000])  # torn
    assert data._read_split(path) is None and same(data._digits_arrays(0.25, 7))
    assert same(data._read_split(path))  # written again, whole
    np.savez(path, x_train=ref[0], x_test=ref[1], y_train=ref[2].astype(np.int32), y_test=ref[3])  # wrong dtype
    assert data._read_split(path) is None and same(data._digits_arrays(0.25, 7))
    off = tmp_path / "xdg"
    monkeypatch.setenv(data.DATA_CACHE_ENV, "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(off))
    assert same(data._digits_arrays(0.25, 7)) and not off.exists()
