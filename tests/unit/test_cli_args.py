"""Numbers on the tools' command lines: type, finiteness and range checked, the flag named."""

from __future__ import annotations

import pytest

from hpu_runtime.cli_args import count, real


def test_count_and_real():
    assert count(1, 10)("7") == 7
    assert real(0.0, 1.0, lo_open=True)("0.25") == 0.25
    for parse, text in ((count(1, 10), "0"), (count(1, 10), "2.5"), (count(1, 10), "true"),
                        (real(0.0, 1.0), "nan"), (real(0.0, 1e6), "inf"), (real(0.0, 1.0, lo_open=True), "0")):
        with pytest.raises(Exception, match="not"):
            parse(text)


def _parsers():
    from hccl.tools import bench, bench_transport
    from launchers import mpi, ray, study
    from models import train

    return {
        "models.train": (train.build_parser(), []),
        "hccl.tools.bench": (None, bench.main),
        "hccl.tools.bench_transport": (None, bench_transport.main),
        "launchers.mpi": (mpi.build_parser(), ["script.py"]),
        "launchers.ray": (ray.build_parser(), ["--num-workers", "2", "script.py"]),
        "launchers.study": (study.build_parser(), ["trace", "--model", "mlp", "--batch-size", "2"]),
    }


@pytest.mark.parametrize(("tool", "flag", "value", "stated"), [
    ("models.train", "--lr", "nan", "finite number in [0, 100]"),
    ("models.train", "--batch-size", "true", "is not an integer"),
    ("models.train", "--bucket-cap-mb", "inf", "finite number in (0, 1e+06] MB"),
    ("models.train", "--epochs", "0", "is not in [1, 1,000,000]"),
    ("hccl.tools.bench", "--ranks", "-1", "is not in [1, 16,777,216] ranks"),
    ("hccl.tools.bench", "--size", "9999G", "over 1 TB"),
    ("hccl.tools.bench_transport", "--load", "1e3", "is not an integer"),
    ("hccl.tools.bench_transport", "--timeout", "0", "finite number in [1, 86400] wall seconds"),
    ("launchers.mpi", "--master-port", "70000", "not a port in [0, 65535]"),
    ("launchers.mpi", "--timeout", "nan", "not in [0, 1e7] wall seconds"),
    ("launchers.ray", "--cpus-per-worker", "0", "finite number in (0, 1024] CPUs"),
    ("launchers.study", "--world-size", "0", "is not in [1, 16,777,216] ranks"),
])
def test_bad_numbers_are_refused_naming_the_flag(tool, flag, value, stated, capsys):
    parser, rest = _parsers()[tool]
    with pytest.raises(SystemExit) as exc:
        if parser is None:
            rest([flag, value])
        else:
            parser.parse_args(rest[:1] + [flag, value] + rest[1:] if tool == "launchers.study" else [flag, value] + rest)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and stated in err, err
