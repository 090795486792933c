"""Stand-in for ``rpicam-vid``: writes a recorded libx264 stream to stdout like the real one.

It parses its arguments by upstream's rules (rpicam-apps ``core/options.cpp``,
``core/video_options.hpp``, ``encoder/encoder.cpp``, ``encoder/libav_encoder.cpp``): an option the
emulated version does not have fails like boost's parser (``ERROR: *** unrecognised option
'--x' ***``, exit 255); ``--help`` lists the options that version has; an unknown ``--awb`` fails
as upstream does; on a BCM2712 board ``--codec h264`` goes through libav, which without
``--libav-format`` cannot open ``-o -`` and exits with upstream's message. Then it writes one
access unit per frame at the requested frame rate, each in a single write as ``--flush`` does,
looping the recording. On a BCM2712 board it encodes with libx264 set up as upstream's libav
encoder does (B-frames unless ``--low-latency``, options from ``--libav-video-codec-opts``).

Environment: ``FAKE_RPICAM_STREAM`` (the .h264 to replay), ``FAKE_RPICAM_LOG`` (append argv,
one line per start), ``FAKE_RPICAM_EXIT_AFTER`` (die with status 1 after N frames, mid-frame),
``FAKE_RPICAM_NO_CAMERA`` (``--list-cameras`` reports none), ``FAKE_RPICAM_SOC`` (``bcm2712``
emulates a Pi 5 / CM5; default a VC4 board), ``FAKE_RPICAM_VERSION`` (default 1.9.0),
``FAKE_RPICAM_LIBAV`` (``0``: built without libav), ``FAKE_RPICAM_LIST_WAIT_FOR`` (a path:
``--list-cameras`` answers only once it exists, giving up after 20 s as if no camera),
``FAKE_RPICAM_UNPLUGGED`` (a path: while it exists the camera is gone, and a start fails as
upstream's does without a camera), ``FAKE_RPICAM_REJECT`` (``--width=1920,--framerate=7``:
a start with one of these values fails as a camera refusing a configuration does).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ruseon_appliance.capture.h264 import AccessUnitSplitter

# Options taking a value, and flags (boost bool options with an implicit value).
VALUE_OPTIONS = {"-t", "--timeout", "--camera", "--codec", "--intra", "-g", "--profile",
                 "--level", "--width",
                 "--height", "--framerate", "--bitrate", "-b", "--shutter", "--gain",
                 "--analoggain", "--awb", "-o", "--output", "--brightness", "--contrast",
                 "--saturation", "--sharpness"}
FLAGS = {"-n", "--nopreview", "--inline", "--flush", "--hflip", "--vflip", "--list-cameras",
         "--help", "-h", "--version"}
LIBAV_VALUE_OPTIONS = {"--libav-format", "--libav-video-codec"}
AWB_MODES = {"auto", "normal", "incandescent", "tungsten", "fluorescent", "indoor", "daylight",
             "cloudy", "custom"}


def version() -> tuple[int, ...]:
    return tuple(int(p) for p in os.environ.get("FAKE_RPICAM_VERSION", "1.9.0").split("."))


def known_options() -> tuple[set[str], set[str]]:
    """(value options, flags) of the emulated build."""
    values, flags = set(VALUE_OPTIONS), set(FLAGS)
    # Up to 1.8.0 the libav options exist only in libav builds (LIBAV_PRESENT); 1.8.1 (4908ce4,
    # encoder plugins) registers them in every build.
    libav_options = os.environ.get("FAKE_RPICAM_LIBAV", "1") != "0" or version() >= (1, 8, 1)
    if libav_options:
        values |= LIBAV_VALUE_OPTIONS
        flags.add("--libav-audio")
        if version() >= (1, 4, 1):  # c480fd9 "libav_encoder: Allow codec options"
            values.add("--libav-video-codec-opts")
    if version() >= (1, 6, 0):  # 6287bff "libav: Add a low latency encode option"
        flags.add("--low-latency")
    return values, flags


def fail(message: str) -> int:
    print(f"ERROR: *** {message} ***", file=sys.stderr, flush=True)
    return 255  # main() returns -1


def parse(args: list[str]) -> dict[str, str] | str:
    """Options given (flags map to ""), or the error message boost / upstream would print."""
    values, flags = known_options()
    given: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline_value = arg.partition("=")
        if name in flags:
            given[name] = inline_value if eq else ""
        elif name in values:
            if eq:
                given[name] = inline_value
            elif i + 1 < len(args):
                i += 1
                given[name] = args[i]
            else:
                return f"the required argument for option '{name}' is missing"
        else:
            return f"unrecognised option '{arg}'"
        i += 1
    return given


def main() -> int:
    args = sys.argv[1:]
    given = parse(args)
    if isinstance(given, str):
        return fail(given)
    if "--help" in given or "-h" in given:
        values, flags = known_options()
        print("Valid options are:")
        for option in sorted(values | flags):
            if option.startswith("--"):
                print(f"  {option} {'arg' if option in values else '[=arg(=1)] (=0)'}")
        return 0
    if "--list-cameras" in given:
        if wait_for := os.environ.get("FAKE_RPICAM_LIST_WAIT_FOR"):
            deadline = time.monotonic() + 20
            while not os.path.exists(wait_for) and time.monotonic() < deadline:
                time.sleep(0.01)
            if not os.path.exists(wait_for):
                print("No cameras available!")
                return 0
        if os.environ.get("FAKE_RPICAM_NO_CAMERA"):
            print("No cameras available!")
        else:
            print("Available cameras\n-----------------\n0 : imx708 [4608x2592 10-bit RGGB]\n"
                  "1 : imx708 [4608x2592 10-bit RGGB]")
        return 0
    if log := os.environ.get("FAKE_RPICAM_LOG"):
        with open(log, "a") as fh:
            fh.write(" ".join(args) + "\n")
    if given.get("--awb", "auto") not in AWB_MODES:
        return fail(f"Invalid AWB mode: {given['--awb']}")
    for rule in filter(None, os.environ.get("FAKE_RPICAM_REJECT", "").split(",")):
        option, _, value = rule.partition("=")
        if given.get(option) == value:  # as libcamera refuses a mode the sensor lacks
            return fail(f"failed to configure streams ({option} {value} not supported)")
    unplugged = os.environ.get("FAKE_RPICAM_UNPLUGGED")
    if unplugged and os.path.exists(unplugged):
        return fail("no cameras available")
    print("fake rpicam-vid: camera started", file=sys.stderr, flush=True)
    if os.environ.get("FAKE_RPICAM_SOC") == "bcm2712" and given.get("--codec", "h264") == "h264":
        # h264_codec_select: no VC4 encoder, so libx264 through libav, if built.
        if os.environ.get("FAKE_RPICAM_LIBAV", "1") == "0":
            return fail("Unable to find an appropriate H.264 codec")
        output = given.get("-o", given.get("--output", ""))
        if not given.get("--libav-format") and output and not output.startswith(
                ("tcp://", "udp://")):
            return fail("libav: cannot allocate output context, try setting with --libav-format")
    fps = int(given.get("--framerate", "30"))
    if os.environ.get("FAKE_RPICAM_SOC") == "bcm2712":
        frames = libav_frames(given, fps)
    else:
        units = AccessUnitSplitter().split_all(
            Path(os.environ["FAKE_RPICAM_STREAM"]).read_bytes())
        frames = (data for _ in iter(int, 1) for data, _ in units)  # the recording, looped
    exit_after = int(os.environ.get("FAKE_RPICAM_EXIT_AFTER", "0"))
    out = sys.stdout.buffer
    start = time.monotonic()
    for n, data in enumerate(frames):
        delay = start + n / fps - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if exit_after and n == exit_after:
            out.write(data[: len(data) // 2])  # die mid-frame, like a crash would
            out.flush()
            print("fake rpicam-vid: simulated failure", file=sys.stderr, flush=True)
            return 1
        out.write(data)
        out.flush()
    return 0


def libav_frames(given: dict[str, str], fps: int) -> Iterator[bytes]:
    """libx264 set up as rpicam-apps' libav encoder does (``encoderOptionsLibx264``, then
    ``encoderOptionsGeneral``), encoding a moving picture; one packet per write, as the raw h264
    muxer writes it."""
    import av
    import numpy as np

    width, height = int(given.get("--width", "640")), int(given.get("--height", "480"))
    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.time_base = Fraction(1, 1_000_000)
    ctx.framerate = Fraction(fps, 1)
    options = {"weightp": "none", "weightb": "0", "motion-est": "dia", "sc_threshold": "0",
               "rc-lookahead": "0", "mixed_ref": "0"}
    if "--low-latency" in given:
        options |= {"preset": "ultrafast", "tune": "zerolatency"}
    else:
        ctx.max_b_frames = 1
        options |= {"preset": "superfast", "partitions": "i8x8,i4x4"}
    if profile := given.get("--profile"):
        ctx.profile = next(p for p in ctx.profiles if p.lower().startswith(profile.lower()))
    ctx.gop_size = int(given.get("--intra", "0")) or fps
    if bitrate := int(given.get("--bitrate", "0")):
        ctx.bit_rate = bitrate
    # --libav-video-codec-opts "k=v;k=v": av_opt_set(codec, k, v, AV_OPT_SEARCH_CHILDREN) after
    # the codec-specific settings above, so these win.
    for opt in filter(None, given.get("--libav-video-codec-opts", "").split(";")):
        key, _, value = opt.partition("=")
        options[key] = value
    ctx.options = options
    y = np.tile(np.arange(width, dtype=np.uint8), (height, 1))
    uv = np.full((height // 2, width), 128, dtype=np.uint8)
    for n in iter(int, 1):
        frame = av.VideoFrame.from_ndarray(np.concatenate([np.roll(y, 3 * n, axis=1), uv]),
                                           format="yuv420p")
        frame.pts = n * 1_000_000 // fps
        for packet in ctx.encode(frame):
            yield bytes(packet)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
