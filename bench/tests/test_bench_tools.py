"""The benchmark tools' logic that runs without a GPU: the SASS control-bit decoding of
sass_stalls.py, the kernel-by-kernel comparison of sass_diff.py, the round averaging and
side-by-side table of compare_builds.py, and the nvidia-smi samples of profile_cuda.py --clocks."""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compare_builds  # noqa: E402
import profile_cuda  # noqa: E402
import sass_diff  # noqa: E402
import sass_stalls  # noqa: E402

# Two instructions of an sm_90a kernel as cuobjdump prints them: an exponential issuing with
# stall 1 into scoreboard 0, then an add that waits on scoreboard 3 and stalls 7 (the MUFU rate).
LISTING = """
        Function : _Z6kernelv
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*d5c0*/                   MUFU.EX2 R34, R34 ;                                         /* 0x0000002200227308 */
                                                                                               /* 0x000e220000000800 */
        /*d5d0*/                   FADD.FTZ R193, R184, R31 ;                                  /* 0x0000001fb8c17221 */
                                                                                               /* 0x008fce0000010000 */
        /*d5e0*/              @!P0 BRA 0xd600 ;                                                /* 0x0000000000048947 */
                                                                                               /* 0x000fea0003800000 */
"""


def test_control_fields_decode_stall_barriers_and_wait_mask():
    mufu = sass_stalls.control_fields(0x000E220000000800)
    assert (mufu["stall"], mufu["yield"], mufu["write_barrier"], mufu["read_barrier"], mufu["wait_mask"]) == (1, 1, 0, 7, 0)
    add = sass_stalls.control_fields(0x008FCE0000010000)
    assert (add["stall"], add["write_barrier"], add["wait_mask"]) == (7, 7, 0b001000)


def test_parse_and_summarize_a_range_with_a_skip():
    functions = sass_stalls.parse(LISTING)
    assert list(functions) == ["_Z6kernelv"]
    instructions = functions["_Z6kernelv"]
    assert [(a, sass_stalls.opcode(t), s) for a, t, s in instructions] == [
        (0xD5C0, "MUFU.EX2", 1), (0xD5D0, "FADD.FTZ", 7), (0xD5E0, "BRA", 5)]
    count, stalls, by_opcode = sass_stalls.summarize(instructions, 0xD5C0, 0xD5F0, [(0xD5D0, 0xD5E0)])
    assert (count, stalls, dict(by_opcode)) == (2, 6, {"MUFU.EX2": 1, "BRA": 5})


def test_parse_names_each_architectures_code_apart():
    two = "\tcode for sm_80\n" + LISTING + "\tcode for sm_90\n" + LISTING.replace("R193", "R192")
    functions = sass_stalls.parse(two)
    assert sorted(functions) == ["_Z6kernelv (sm_80)", "_Z6kernelv (sm_90)"]
    assert [len(i) for i in functions.values()] == [3, 3]
    assert list(sass_stalls.parse("\tcode for sm_90\n" + LISTING)) == ["_Z6kernelv"]  # one architecture


def test_loops_are_found_from_their_back_branches():
    functions = sass_stalls.parse(LISTING.replace("BRA 0xd600", "BRA 0xd5c0"))
    instructions = functions["_Z6kernelv"]
    assert sass_stalls.loops(instructions, least=3) == [(0xD5C0, 0xD5F0)]
    assert sass_stalls.loops(instructions, least=4) == []  # too short to list
    assert sass_stalls.loops(sass_stalls.parse(LISTING)["_Z6kernelv"], least=1) == []  # a forward branch


def test_sass_diff_names_the_kernels_whose_instructions_differ():
    moved = LISTING.replace("/*d5", "/*e5")  # the same kernel at other addresses
    renamed = LISTING.replace("R193", "R192").replace("_Z6kernelv", "_Z6otherv")
    before = sass_stalls.parse(LISTING + renamed)
    assert sass_diff.compare(before, sass_stalls.parse(moved + LISTING.replace("_Z6kernelv", "_Z6otherv"))) == [
        ("same", 3, 3, "_Z6kernelv"), ("differs", 3, 3, "_Z6otherv")]
    assert sass_diff.compare(before, sass_stalls.parse(LISTING)) == [
        ("same", 3, 3, "_Z6kernelv"), ("before only", 3, 0, "_Z6otherv")]
    # A kernel whose name changed, compared by --pair with the one it replaces.
    after = sass_stalls.parse(LISTING.replace("_Z6kernelv", "_Z6kernelILb0EEvv"))
    assert sass_diff.compare(*sass_diff.paired(before, after, "kernelv", "kernelI")) == [
        ("same", 3, 3, "_Z6kernelILb0EEvv")]


def test_rounds_average_what_each_measured():
    key = (128, 4096, False)
    first = {key: {"d": 128, "ours_fwd": 600.0, "cudnn_fwd": 610.0, "ours_bwd": float("nan")}}
    second = {key: {"d": 128, "ours_fwd": 620.0, "cudnn_fwd": 630.0, "ours_bwd": 500.0}}
    row = compare_builds.average_rounds([first, second])[key]
    assert row["ours_fwd"] == 610.0 and row["cudnn_fwd"] == 620.0
    assert row["ours_bwd"] == 500.0  # the round that measured it
    assert row["d"] == 128  # not a figure: kept as it is
    alone = compare_builds.average_rounds([{key: {"ours_bwd": float("nan")}}])[key]
    assert math.isnan(alone["ours_bwd"])


def test_side_by_side_gives_each_build_its_gain_over_the_first():
    key = (128, 4096, True)
    base = {key: {"ours_fwd": 500.0, "cudnn_fwd": 520.0, "cudnn_bwd": float("nan")}}
    other = {key: {"ours_fwd": 525.0}}
    table = compare_builds.side_by_side([("main", base), ("branch", other)]).splitlines()
    assert table[0] == "| d | N | causal | cuDNN fwd | cuDNN bwd | FLASH fwd | FLASH bwd | main fwd | branch fwd | branch/main fwd |"
    assert table[2] == "| 128 | 4096 | yes | 520 | - | - | - | 500 | 525 | +5.0% |"


def test_tests_and_checks_leave_the_reference_out_unless_asked():
    assert compare_builds.tested_sources(3, True, False) == [False, True, True]
    assert compare_builds.tested_sources(3, True, True) == [True, True, True]
    assert compare_builds.tested_sources(2, False, True) == [False, False]


def test_mirrored_medians_give_every_closure_an_early_and_a_late_place(monkeypatch):
    import contextlib

    import bench_cuda

    timed = []

    def drifting_median_ms(fn):  # clocks fall by 10% of the first call's per call
        timed.append(fn.__name__)
        return fn() * (1.0 + 0.1 * (len(timed) - 1))

    def closure(name, ms):
        fn = lambda: ms  # noqa: E731
        fn.__name__ = name
        return fn

    entered = []

    @contextlib.contextmanager
    def recording():
        entered.append(len(timed))
        yield

    monkeypatch.setattr(bench_cuda, "median_ms", drifting_median_ms)
    groups = [(contextlib.nullcontext, [("a", closure("a", 1.0)), ("b", closure("b", 1.0))]),
              (recording, [("c", closure("c", 2.0))])]
    ms = bench_cuda.mirrored_medians(groups)
    assert timed == ["a", "b", "c", "c", "b", "a"]
    assert entered == [2, 3]  # the second group's context, around its closures in both rounds
    assert math.isclose(ms["a"], 1.25) and math.isclose(ms["b"], 1.25) and math.isclose(ms["c"], 2.5)


def test_sm80_kernels_restore_the_callers_choice(monkeypatch):
    import bench_cuda

    monkeypatch.delenv("FLASHATTN_CUDA_KERNELS", raising=False)
    with bench_cuda.sm80_kernels():
        assert os.environ["FLASHATTN_CUDA_KERNELS"] == "sm80"
    assert "FLASHATTN_CUDA_KERNELS" not in os.environ
    monkeypatch.setenv("FLASHATTN_CUDA_KERNELS", "sm90")
    with bench_cuda.sm80_kernels():
        assert os.environ["FLASHATTN_CUDA_KERNELS"] == "sm80"
    assert os.environ["FLASHATTN_CUDA_KERNELS"] == "sm90"


def test_clock_samples_parse_and_name_what_held_the_clock():
    output = "1665, 654.12, 63, 0x0000000000000004\n" \
             "Failed to query something\n" \
             "1980, 510.50, 60, 0x0000000000000000\n" \
             "1700, 600.00, 61, 0x0000000000000020\n"
    samples = profile_cuda.parse_clock_samples(output)
    assert samples == [(1665.0, 654.12, 63.0, 4), (1980.0, 510.5, 60.0, 0), (1700.0, 600.0, 61.0, 0x20)]
    assert profile_cuda.clock_reasons(samples) == "power cap, sw thermal"
    assert profile_cuda.clock_reasons(samples[1:2]) == "nothing"
    assert profile_cuda.parse_clock_samples("[N/A], [N/A], 40, 0x0\n") == []


def test_clocks_command_takes_a_shape_and_refuses_others():
    assert compare_builds.clock_shape("128:16384:causal") == (128, 16384, True)
    command = compare_builds.clocks_command(compare_builds.clock_shape("128:16384:causal"), "lib.so", "cudnn")
    assert command[1].endswith("profile_cuda.py")
    assert command[2:] == ["--library", "lib.so", "--d", "128", "--n", "16384", "--reference", "cudnn", "--clocks",
                           "--causal"]
    assert "--causal" not in compare_builds.clocks_command(compare_builds.clock_shape("64:1024"), "lib.so", "flash")
    for bad in ("128", "128:1k", "128:1024:masked", "a:b"):
        try:
            compare_builds.clock_shape(bad)
        except argparse.ArgumentTypeError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
