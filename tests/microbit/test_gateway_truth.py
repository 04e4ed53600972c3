"""The gateway's ground truth at a clean stop (issue #20): a board sends a sample's report right after the
sample, so a gateway stopped between the two frames had logged a reading whose report it never sent, and
the live checker counted the answer over it as a violation at the end of a run (seen once in test_live_job).
The gateway now logs a sample once the board's next frame is read. Oracle: the board's own filter code
(firmware/microbit/qff.py, via test_gateway_loss.Board) says which samples it reported; the report frame of every
sample in the truth file has reached the bridge."""
import os
import pty
import random
import time

from edge.runtime.gateway.gateway import Gateway

from test_gateway_loss import Board


def test_a_sample_is_in_the_ground_truth_only_once_its_report_has_reached_the_bridge(tmp_path):
    master, slave = pty.openpty()
    cfg = {"fleet": "t", "gateway": "g0", "password": "x", "port": 1, "truth": str(tmp_path),
           "sensors": [{"name": "b0", "port": os.ttyname(slave)}]}
    gw = Gateway(cfg)
    s = gw.sensors[0]
    fed, acted, cur, from_device, act = set(), set(), [None], s.bridge.from_device, gw.act
    s.bridge.from_device = lambda now, line: fed.add(line) or cur.__setitem__(0, line) or from_device(now, line)
    gw.act = lambda sensor, now, actions: act(sensor, now, actions) or acted.add(cur[0])   # a frame's actions done
    board = Board(seed=5)
    s.truth = _Checked(s.truth, board, acted)
    board.a.h = 600                             # a half-width the walk (steps up to 400) leaves often
    rng = random.Random(5)
    wire = b"junk\n"                            # the gateway drops the first line read (it may be partial)
    for tick in range(1, 400):
        n = len(board.lines)
        board.sample(tick * 100)
        wire += b"".join(line + b"\n" for line in board.lines[n:])
        if rng.random() < 0.3:                  # the gateway reads whatever has arrived, cut anywhere
            cut = rng.randrange(len(wire) + 1)
            os.write(master, wire[:cut])
            wire = wire[cut:]
            gw.read(s, 1000.0 + tick / 10)
    board.a.v = None                            # the last sample is reported: stop between its two frames
    n = len(board.lines)
    board.sample(400 * 100)
    last = b"".join(line + b"\n" for line in board.lines[n:])
    assert last.startswith(b"V ") and b"\nR " in last
    os.write(master, wire + last[:last.index(b"\nR ") + 1] + b"R 9")   # the report frame is cut off
    final = last[:last.index(b"\n")]
    for _ in range(500):                        # a pty hands writes over asynchronously: read until all is in
        gw.read(s, 1040.0)
        if final in fed:
            break
        time.sleep(0.01)
    s.truth.close()
    with open(os.path.join(str(tmp_path), "truth-b0.csv")) as f:
        logged = len(f.readlines())
    pairs = _pairs(board.lines)
    assert s.truth.ok == [True] * logged                    # each sample logged once its report had gone out
    assert logged == len(pairs) - 1 and sum(1 for _, r in pairs[:logged] if r is not None) > 20
    assert all(v in fed and (r is None or r in fed) for v, r in pairs[:logged])
    os.close(master)
    os.close(slave)


def _pairs(lines):
    """Each sample frame in order, with the report frame the board sent right after it (None: no report)."""
    return [(line, lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith(b"R ") else None)
            for i, line in enumerate(lines) if line.startswith(b"V ")]


class _Checked:
    """A truth file noting, at each sample written, whether that sample's report frame had been acted on."""

    def __init__(self, f, board, acted):
        self.f, self.board, self.acted, self.ok = f, board, acted, []

    def write(self, text):
        _, report = _pairs(self.board.lines)[len(self.ok)]
        self.ok.append(report is None or report in self.acted)
        return self.f.write(text)

    def close(self):
        self.f.close()
