"""GET /metrics's text (morph/serve/metrics.py) without a server: counters by how requests ended, the two histograms
(cumulative buckets, sum, count) and the engine's gauges, in Prometheus's exposition format."""

from morph.serve.metrics import RTF_BUCKETS, TTFA_BUCKETS, Metrics

ENGINE = dict(rows_live=3, rows_waiting=2, width=8, cache_slots=140)


def lines(metrics: Metrics) -> list[str]:
    return metrics.text(ENGINE).splitlines()


def test_counters_histograms_and_gauges():
    m = Metrics()
    m.count("busy")
    m.first_audio(0.02)  # on a bound: counted in that bucket (le)
    m.first_audio(9.0)  # past the last bound: only in +Inf
    m.finished("ok", 4.0, 2.0)  # 2x real time
    m.finished("cancelled", 1.0, 5.0)  # not in the real-time factor
    m.finished("ok", 1.0, 0.0)  # no time: no factor
    out = lines(m)
    assert 'morph_requests_total{status="busy"} 1' in out and 'morph_requests_total{status="ok"} 2' in out
    assert 'morph_requests_total{status="cancelled"} 1' in out
    ttfa = [x for x in out if x.startswith("morph_time_to_first_audio_seconds")]
    assert ttfa[:3] == ['morph_time_to_first_audio_seconds_bucket{le="0.01"} 0',
                        'morph_time_to_first_audio_seconds_bucket{le="0.02"} 1',
                        'morph_time_to_first_audio_seconds_bucket{le="0.03"} 1']
    assert ttfa[len(TTFA_BUCKETS) - 1] == 'morph_time_to_first_audio_seconds_bucket{le="5"} 1'
    assert ttfa[-3:] == ['morph_time_to_first_audio_seconds_bucket{le="+Inf"} 2',
                         "morph_time_to_first_audio_seconds_sum 9.020000",
                         "morph_time_to_first_audio_seconds_count 2"]
    rtf = [x for x in out if x.startswith("morph_real_time_factor")]
    assert rtf[:3] == ['morph_real_time_factor_bucket{le="0.5"} 0', 'morph_real_time_factor_bucket{le="1"} 0',
                       'morph_real_time_factor_bucket{le="2"} 1']
    assert len(rtf) == len(RTF_BUCKETS) + 3 and rtf[-1] == "morph_real_time_factor_count 1"
    assert "morph_audio_seconds_total 6.000" in out
    for key, value in ENGINE.items():
        assert f"morph_{key} {value}" in out and f"# TYPE morph_{key} gauge" in out
    assert "# TYPE morph_requests_total counter" in out and "# TYPE morph_real_time_factor histogram" in out
    assert m.text(ENGINE).endswith("\n")


def test_an_idle_server_has_empty_histograms():
    out = lines(Metrics())
    assert not [x for x in out if x.startswith("morph_requests_total{")]
    assert 'morph_time_to_first_audio_seconds_bucket{le="+Inf"} 0' in out
    assert "morph_time_to_first_audio_seconds_sum 0.000000" in out
