"""`trainperf bench kernels` refuses every bad argument in one line before any note or work."""

import pytest

from trainperf.cli import main


def _bench_must_not_start(*args, **kwargs):
    raise AssertionError("the benchmark started before the arguments were checked")


@pytest.mark.parametrize("args,named", [
    (["--dtype", "fp64"], "--dtype"),
    (["--kernels", "rms_norm,nope"], "'nope'"),
    (["--impls", "eager,tvm"], "'tvm'"),
    (["--passes", "bwd"], "--passes"),
    (["--passes", ","], "--passes"),
    (["--device", "tpu"], "--device"),
    (["--shapes", "4x4x4x4x4"], "--shapes"),
    (["--shapes", "0x8"], "--shapes"),
    (["--html", "{tmp}"], "--html {tmp}: is a folder"),
    (["--html", "{tmp}/a_file/b.html"], "a_file is a file"),
])
def test_bad_arguments_are_one_line_before_any_note_or_work(args, named, tmp_path, monkeypatch, capsys):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr("trainperf.bench.run.run_bench", _bench_must_not_start)
    argv = ["bench", "kernels", "--device", "cpu", "--no-record", *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    named = named.replace("{tmp}", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1 and named in err[0], err
    assert "Triton interpreter" not in err[0]  # the CPU note comes only once the arguments are good


def test_cpu_note_is_printed_once(tmp_path, monkeypatch, capsys):
    """The demo printed the interpreter note before the table and again after it."""
    import dataclasses

    from trainperf.bench.run import CPU_WARNING, BenchResult, Row

    row = Row("rms_norm", "eager", "8x8", "fp32", "fwd", 0.1, 0.5, 0.001, 20.0, None, None, 0.0, 1.0)
    result = BenchResult("cpu", "cpu", "fp32", 2.0, None, None, [row], [CPU_WARNING, "liger: not installed"])
    monkeypatch.setattr("trainperf.bench.run.run_bench", lambda *a, **k: dataclasses.replace(result))
    with pytest.raises(SystemExit) as e:
        main(["bench", "kernels", "--device", "cpu", "--no-record"])
    out = capsys.readouterr()
    assert e.value.code == 0 and (out.out + out.err).count("Triton interpreter") == 1, out
    assert "note: liger: not installed" in out.out  # other notes still follow the table
