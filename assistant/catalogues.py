"""Compiling the gettext catalogues (``locale/<lang>/LC_MESSAGES/*.po`` → ``.mo``).

Django's ``compilemessages`` runs GNU ``msgfmt``, which a machine may not have; polib is pure
Python and installs with the site, so ``scripts/setup`` compiles with it on any machine:
``python -m assistant.catalogues``. A catalogue is compiled again only when its ``.po`` is newer
than its ``.mo``. Fuzzy entries are left out, as msgfmt leaves them out.
"""

import sys
from pathlib import Path

import polib

ROOT = Path(__file__).resolve().parent.parent
LOCALE_DIRS = [ROOT / "locale"]


def compile_catalogues(locale_dirs: list[Path] = LOCALE_DIRS, *, force: bool = False) -> list[Path]:
    """Compile every ``.po`` under ``locale_dirs`` whose ``.mo`` is missing or older; returns the
    ``.mo`` files written."""
    written: list[Path] = []
    for locale_dir in locale_dirs:
        for po_path in sorted(locale_dir.glob("*/LC_MESSAGES/*.po")):
            mo_path = po_path.with_suffix(".mo")
            if (
                not force
                and mo_path.exists()
                and mo_path.stat().st_mtime >= po_path.stat().st_mtime
            ):
                continue
            catalogue = polib.pofile(str(po_path))
            for entry in catalogue.fuzzy_entries():
                catalogue.remove(entry)
            tmp = mo_path.with_suffix(".mo.tmp")
            catalogue.save_as_mofile(str(tmp))
            tmp.replace(mo_path)
            written.append(mo_path)
    return written


if __name__ == "__main__":
    for path in compile_catalogues(force="--force" in sys.argv[1:]):
        print(f"compiled {path.relative_to(ROOT)}")
