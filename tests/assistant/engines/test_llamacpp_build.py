"""The installed llama.cpp library is portable: it runs on any x86-64-v3 CPU, whatever the CPU of
the machine that built it advertised.

A library built with -march=native on a host that lists AMX carries tile instructions, and on a
CPU whose kernel never enabled the tile state it faults at the first decode. A CI machine
without such a CPU cannot see that fault, so these checks are static: the instructions in the
shared objects (objdump), llama.cpp's own list of compiled CPU features, and the flags that
scripts/setup recorded when it built the wheel. The scanner is itself checked against an object
compiled with a tile instruction, so a scan that finds nothing means something.
"""

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.machine() not in {"x86_64", "AMD64"}, reason="x86-64 instruction sets only"
)

#: AMX (tile) instructions, as objdump spells them.
AMX = re.compile(r"\s(ldtilecfg|sttilecfg|tileloadd\w*|tilestored|tilerelease|tilezero|tdp\w+)\s")
#: Any AVX-512 register: a portable (x86-64-v3) build never touches one.
AVX512 = re.compile(r"%zmm\d+|%k[1-7]\b")
STAMP = Path(sys.prefix) / "llama-build"


def scan(library: Path) -> dict[str, int]:
    """How many AMX and AVX-512 instructions the machine code in ``library`` holds."""
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(library)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert len(listing) > 1000, f"objdump printed almost nothing for {library}"
    counts = {"amx": 0, "avx512": 0}
    for line in listing.splitlines():
        counts["amx"] += bool(AMX.search(line + " "))
        counts["avx512"] += bool(AVX512.search(line))
    return counts


def libraries() -> list[Path]:
    import llama_cpp

    found = sorted((Path(llama_cpp.__file__).parent / "lib").glob("*.so*"))
    assert any(p.name.startswith("libggml-cpu") for p in found), found
    return found


def test_the_scanner_finds_a_tile_instruction(tmp_path: Path) -> None:
    """An object compiled with one AMX tile instruction is reported as AMX code."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the scanner's positive example")
    source = tmp_path / "tile.c"
    source.write_text(
        "#include <immintrin.h>\n"
        "void configure(const void *config) { _tile_loadconfig(config); }\n"
        "void wide(float *out, const float *in) {\n"
        "  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(in), _mm512_loadu_ps(out)));\n"
        "}\n"
    )
    library = tmp_path / "libtile.so"
    subprocess.run(
        ["gcc", "-O2", "-mamx-tile", "-mavx512f", "-shared", "-fPIC", str(source), "-o", library],
        check=True,
    )

    counts = scan(library)

    assert counts["amx"] >= 1, counts
    assert counts["avx512"] >= 1, counts


def test_installed_libraries_hold_no_amx_or_avx512_code() -> None:
    """No shared object of the installed llama.cpp holds an AMX or AVX-512 instruction."""
    found = {library.name: scan(library) for library in libraries()}

    assert all(counts == {"amx": 0, "avx512": 0} for counts in found.values()), found


def test_llama_cpp_reports_avx2_and_no_amx_or_avx512() -> None:
    """llama.cpp's own feature list: AVX2 and FMA compiled in, no AMX, no AVX-512."""
    from assistant.engines.llamacpp_probe import system_info

    features = dict(re.findall(r"(\w+) = (\d)", system_info()))

    assert features.get("AVX2") == "1" and features.get("FMA") == "1", features
    assert not {name for name, on in features.items() if on == "1" and "AMX" in name}, features
    assert not {name for name, on in features.items() if on == "1" and "AVX512" in name}, features


def test_the_recorded_build_is_portable() -> None:
    """scripts/setup recorded a portable build: native tuning off, AMX and AVX-512 off."""
    assert STAMP.is_file(), f"{STAMP} is missing: llama-cpp-python was not installed by setup"
    variant, *_ = STAMP.read_text().split()
    flags = STAMP.read_text().split("\n", 1)[1].split()

    assert variant == "portable", STAMP.read_text()
    assert "-DGGML_NATIVE=OFF" in flags, flags
    assert not [f for f in flags if "march=native" in f or re.match(r"-DGGML_AMX\w*=ON", f)]
    assert "-DGGML_AVX512=OFF" in flags and "-DGGML_AVX2=ON" in flags, flags
