"""CPython runtime inputs and device.toml: serial lines (pyserial loop://), user functions, config paths."""
from edge.runtime.cpython import config, inputs


def reading(now):
    return None if now < 1 else now * 2


def test_serial_lines_parse_source_value_and_keep_partial_lines():
    s = inputs.SerialLines("loop://", t0=0.0)
    s.port.write(b"a,1.5\nb,oops\nnoise\na,2")
    assert s.poll(0.0) == [("a", 1.5), ("b", None)] and s.next_time() == 0.05
    s.port.write(b".5\n")
    assert s.poll(0.1) == [("a", 2.5)]


def test_function_input_and_config_resolution(tmp_path):
    (tmp_path / "trace.csv").write_text("0,c,1\n")
    path = tmp_path / "device.toml"
    path.write_text('fleet = "f"\ndevice = "d"\npassword = "p"\nground_truth = "truth.csv"\n'
                    '[sources.f]\nkind = "function"\ncall = "test_inputs:reading"\nperiod = 0.5\n'
                    '[sources.c]\nkind = "csv"\npath = "trace.csv"\n')
    cfg = config.load(str(path))
    assert cfg["broker"]["port"] == 1883 and cfg["ground_truth"] == str(tmp_path / "truth.csv")
    assert list(cfg["sources"]) == ["f", "c"] and cfg["sources"]["c"]["path"] == str(tmp_path / "trace.csv")
    ins = inputs.build(cfg, 0.0)
    fn = [i for i in ins if isinstance(i, inputs.Function)][0]
    assert fn.poll(0.0) == () and fn.next_time() == 0.5 and fn.poll(3.0) == (("f", 6.0),) and fn.next_time() == 3.5
