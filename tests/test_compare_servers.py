"""Tests of benchmarks/compare_servers.py without servers: arguments, record maths, run bounds."""

from __future__ import annotations

import pytest

from tools.stats import Record, Window




def _run(latencies_ms, errors=(), seconds=20.0):
    """Raw records of one run started after a 1 s warm-up and completed well inside the window."""
    records = [Record(1.0, float(v), True) for v in latencies_ms]
    records += [Record(1.0, 1.0, False, error) for error in errors]
    return records, Window(1.0, 1.0 + seconds)


def test_summary_counts_only_successes_and_takes_nearest_rank_percentiles(compare):
    latencies = [float(v) for v in range(100, 0, -1)]  # 1..100 ms, unsorted
    result = compare.summarise("triton", "http", 32, *_run(latencies, ["HTTP 503: busy"], 20.0))
    point = result.point
    assert point.requests == 100 and point.errors == 1
    assert point.throughput == pytest.approx(5.0)  # 100 completed / 20 s; the error not counted
    assert (point.p50_ms, point.p99_ms) == (50.0, 99.0)  # observed values, not interpolated
    assert point.first_error == "HTTP 503: busy"


def test_ratio_is_throughput_over_the_best_of_the_run(compare):
    results = [compare.summarise(name, "http", 32, *_run([10.0] * n, seconds=10.0))
               for name, n in (("triton", 400), ("pytriton", 500), ("fastapi", 250))]
    best = compare.add_ratios(results)
    assert best.server == "pytriton"
    assert [r.ratio for r in results] == pytest.approx([0.8, 1.0, 0.5])
    rows = compare.format_table(results).splitlines()
    assert rows[2].split()[-1] == "0.80" and rows[4].split()[-1] == "0.50"


def test_run_without_successes_reports_no_percentiles(compare):
    result = compare.summarise("fastapi", "http", 8, *_run([], ["timeout"] * 3, 5.0))
    assert (result.throughput, result.point.p50_ms, result.point.p99_ms) == (0.0, None, None)
    assert "-" in compare.format_table([result]).splitlines()[2]


@pytest.mark.parametrize("argv, message", [
    (["--servers", "triton,torchserve"], "--servers"),
    (["--concurrency", "0"], "--concurrency"),
    (["--duration", "0.5"], "--duration"),
    (["--texts", "/nonexistent/texts.txt"], "--texts"),
    (["--repository", "/nonexistent/repo"], "--repository"),
])
def test_bad_arguments_exit_2_naming_the_option(compare, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        compare.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_measure_every_server_at_concurrency_32_with_bounds(compare):
    args = compare.parse_args([])
    assert args.servers == ["triton", "pytriton", "pytriton-chunks", "fastapi"]
    assert (args.concurrency, args.duration, args.warmup, args.grpc) == (32, 20.0, 5.0, True)
    assert args.max_requests > 0 and args.request_timeout > 0


def test_both_triton_servers_get_the_identical_kserve_json_body(compare):
    texts = ["ein Satz", "日本語のテキスト"]
    assert compare.http_bodies("triton", texts) == compare.http_bodies("pytriton", texts)
    assert compare.http_path("pytriton") == "/v2/models/text_embedding/infer"
    assert compare.http_bodies("fastapi", texts)[0] == b'{"text": "ein Satz"}'
    with pytest.raises(ValueError, match="expected 384 floats, got 3"):
        compare.parse_http_answer("fastapi", b'{"embedding": [1, 2, 3]}')


def test_every_server_gets_the_same_http_sender_and_fastapi_its_own_path(compare):
    texts = ["ein Satz"]
    triton, sender, _ = compare.load_for("triton", "http", "127.0.0.1:1", texts, 5.0)
    fastapi, other, _ = compare.load_for("fastapi", "http", "127.0.0.1:1", texts, 5.0)
    assert type(sender) is type(other) and (sender.kind, sender.protocol) == ("raw-http", "http")
    assert sender.prepare(triton[0]).startswith(b"POST /v2/models/text_embedding/infer HTTP/1.1")
    assert other.prepare(fastapi[0]).startswith(b"POST /embed HTTP/1.1")
    assert other.prepare(fastapi[0]).endswith(b'\r\n\r\n{"text": "ein Satz"}')
    with pytest.raises(ValueError, match="expected 384 floats"):
        other.check(b'{"embedding": [1, 2, 3]}')  # a wrong answer counts as failed


def test_rounds_are_summarised_by_the_median_per_server_and_protocol(compare):
    rows = []
    for number, (ours, theirs) in enumerate([(40.0, 30.0), (60.0, 50.0), (50.0, 10.0)], 1):
        for server, rate in (("triton", ours), ("fastapi", theirs)):
            row = compare.summarise(server, "http", 32, *_run([rate] * int(rate), seconds=1.0))
            row.round = number
            rows.append(row)
    medians = compare.median_results(rows)
    compare.add_ratios(medians)
    by_server = {r.server: r for r in medians}
    assert by_server["triton"].throughput == 50.0 and by_server["fastapi"].throughput == 30.0
    assert by_server["fastapi"].ratio == pytest.approx(0.6)
    assert by_server["triton"].notes == "median of 3 rounds"
