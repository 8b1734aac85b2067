"""GET /metrics's text (morph/serve/metrics.py) without a server: counters by how requests ended, the two histograms
(cumulative buckets, sum, count) and the engine's gauges, in Prometheus's exposition format."""

from morph.serve.metrics import RTF_BUCKETS, TTFA_BUCKETS, Metrics

ENGINE = dict(rows_live=3, rows_waiting=2, width=8, cache_slots=140)


def lines(metrics: Metrics) -> list[str]:
    return metrics.text(ENGINE).splitlines()


def test_counters_histograms_and_gauges():
    m = Metrics()
    m.count("busy")
    m.count("busy")
    m.first_audio(0.02)  # on a bound: counted in that bucket (le)
    m.first_audio(9.0)  # past the last bound: only in +Inf
    m.first_audio(0.015)
    m.finished("ok", 4.0, 2.0)  # 2x real time
    m.finished("cancelled", 1.0, 5.0)  # not in the real-time factor
    m.finished("ok", 1.0, 0.0)  # no time: no factor
    m.finished("ok", 0.1, 0.5)  # 0.2x: under a second is still a time
    out = lines(m)
    assert 'morph_requests_total{status="busy"} 2' in out and 'morph_requests_total{status="ok"} 3' in out
    assert 'morph_requests_total{status="cancelled"} 1' in out
    ttfa = [x for x in out if x.startswith("morph_time_to_first_audio_seconds")]
    assert ttfa[:3] == ['morph_time_to_first_audio_seconds_bucket{le="0.01"} 0',
                        'morph_time_to_first_audio_seconds_bucket{le="0.02"} 2',  # two in one bucket
                        'morph_time_to_first_audio_seconds_bucket{le="0.03"} 2']
    assert ttfa[len(TTFA_BUCKETS) - 1] == 'morph_time_to_first_audio_seconds_bucket{le="5"} 2'
    assert ttfa[-3:] == ['morph_time_to_first_audio_seconds_bucket{le="+Inf"} 3',
                         "morph_time_to_first_audio_seconds_sum 9.035000",
                         "morph_time_to_first_audio_seconds_count 3"]
    rtf = [x for x in out if x.startswith("morph_real_time_factor")]
    assert rtf[:3] == ['morph_real_time_factor_bucket{le="0.5"} 1', 'morph_real_time_factor_bucket{le="1"} 1',
                       'morph_real_time_factor_bucket{le="2"} 2']
    assert len(rtf) == len(RTF_BUCKETS) + 3 and rtf[-1] == "morph_real_time_factor_count 2"
    assert "morph_audio_seconds_total 6.100" in out
    for key, value in ENGINE.items():
        assert f"morph_{key} {value}" in out and f"# TYPE morph_{key} gauge" in out
    for header in ("# HELP morph_requests_total Speech requests by how they ended.",
                   "# TYPE morph_requests_total counter",
                   "# HELP morph_time_to_first_audio_seconds From a request's arrival to its first audio.",
                   "# TYPE morph_time_to_first_audio_seconds histogram",
                   "# HELP morph_real_time_factor Seconds of audio per second of a request, finished ones.",
                   "# TYPE morph_real_time_factor histogram", "# TYPE morph_audio_seconds_total counter",
                   "# HELP morph_rows_live Rows decoding in the batch at its last frame.",
                   "# HELP morph_cache_slots Key/value cache slots the live rows use (prompt and frames so far)."):
        assert header in out
    assert m.text(ENGINE).endswith("\n")


def test_an_idle_server_has_empty_histograms():
    out = lines(Metrics())
    assert not [x for x in out if x.startswith("morph_requests_total{")]
    assert 'morph_time_to_first_audio_seconds_bucket{le="+Inf"} 0' in out
    assert "morph_time_to_first_audio_seconds_sum 0.000000" in out
