"""The datasets folder (trainer_backend/workbench/library.py): create, upload, .zip, import, subsets,
delete; bad input (zip-slip, zip bomb, a 100-megapixel image, a non-image named .png, a read-only
folder) is refused with one line and changes nothing."""
import os
import struct
import zipfile
import zlib

import pytest

from tests.workbench_images import pattern, write_dataset
from trainer_backend.workbench.library import (LibraryError, add_files, add_zip, create_dataset, delete_dataset,
                                               import_folder, list_datasets, make_subset, set_repeats, subsets)


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
                  and ".workbench" not in p.parts)


def huge_png_header(path, width=12000, height=9000):
    """A PNG whose header says 108 megapixels (the pixels themselves never need to exist)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def test_create_upload_and_list(tmp_path):
    ds = create_dataset(tmp_path / "datasets", "my dog")
    src = write_dataset(tmp_path / "upload", 2)
    added = add_files(ds, [("dog.png", src[0]), ("dog.txt", src[0].with_suffix(".txt")), ("cat.png", src[1])])
    added += add_files(ds, [("dog.png", src[1])])
    assert [p.name for p in added] == ["dog.png", "cat.png", "dog-1.png"]   # a taken name is never overwritten
    assert (ds / "dog.txt").read_text() == "a photo, pattern 0"
    [info] = list_datasets(tmp_path / "datasets")
    assert (info.name, info.images, info.captioned, info.made_here) == ("my dog", 3, 1, True)


def test_bad_uploads_change_nothing(tmp_path):
    ds = create_dataset(tmp_path, "ds")
    good = write_dataset(tmp_path / "upload", 1)[0]
    fake = tmp_path / "fake.png"
    fake.write_text("not a picture")
    with pytest.raises(LibraryError, match=r"^fake\.png: not an image"):
        add_files(ds, [("good.png", good), ("fake.png", fake)])
    huge_png_header(tmp_path / "huge.png")
    with pytest.raises(LibraryError, match=r"huge\.png: image is enormous \(12000×9000 = 108 megapixels"):
        add_files(ds, [("huge.png", tmp_path / "huge.png")])
    with pytest.raises(LibraryError, match="not an image, a clip or a caption"):
        add_files(ds, [("run.sh", fake)])
    assert _files(ds) == []


def test_zip_keeps_subsets_and_refuses_escapes_and_bombs(tmp_path):
    ds = create_dataset(tmp_path, "ds")
    pattern(1).save(tmp_path / "a.png")
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as z:
        z.write(tmp_path / "a.png", "10_dog/a.png")
        z.writestr("10_dog/a.txt", "ohwx dog")
        z.writestr("__MACOSX/._a.png", "junk")
    add_zip(ds, good)
    assert _files(ds) == ["10_dog/a.png", "10_dog/a.txt"] and subsets(ds) == [("10_dog", 10, "dog")]
    slip = tmp_path / "slip.zip"
    with zipfile.ZipFile(slip, "w") as z:
        z.write(tmp_path / "a.png", "b.png")
        z.writestr("../../escaped.png", "x")
    with pytest.raises(LibraryError, match=r"'\.\./\.\./escaped\.png' points outside the dataset \(zip-slip\)"):
        add_zip(ds, slip)
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.png", b"\0" * (80 << 20))
    with pytest.raises(LibraryError, match="zip bomb"):
        add_zip(ds, bomb)
    assert _files(ds) == ["10_dog/a.png", "10_dog/a.txt"]
    assert not (tmp_path.parent / "escaped.png").exists()


def test_import_copies_and_subsets_and_repeats(tmp_path):
    source = tmp_path / "pics"
    write_dataset(source / "sub", 2)
    ds = create_dataset(tmp_path / "datasets", "ds")
    import_folder(source, ds)
    assert _files(ds) == ["sub/img_00000.png", "sub/img_00000.txt", "sub/img_00001.png", "sub/img_00001.txt"]
    assert len(_files(source)) == 4                                 # copied, never moved
    with pytest.raises(LibraryError, match="overlap"):
        import_folder(ds, ds / "sub")
    make_subset(ds, "cat", 5)
    set_repeats(ds, "5_cat", 12)
    assert subsets(ds) == [("12_cat", 12, "cat")]


def test_delete_only_what_the_studio_made(tmp_path):
    mine = create_dataset(tmp_path, "mine")
    write_dataset(mine, 1)
    theirs = tmp_path / "theirs"
    write_dataset(theirs, 1)
    with pytest.raises(LibraryError, match="not created by the studio"):
        delete_dataset(theirs)
    (mine / "notes.docx").write_text("the user's own file")
    with pytest.raises(LibraryError, match=r"holds files the studio did not bring in \(notes\.docx\)"):
        delete_dataset(mine)
    (mine / "notes.docx").unlink()
    delete_dataset(mine)
    assert not mine.exists() and theirs.exists()


def test_read_only_dataset(tmp_path):
    """As a user who may not write the folder (a forked child as uid 65534 when the suite runs as root)."""
    from unprivileged import as_writer_without_rights, read_only_place
    upload = write_dataset(tmp_path / "u", 1)[0]
    with read_only_place() as place:
        ds = create_dataset(place, "ds")
        before = sorted(p.name for p in ds.rglob("*"))
        upload_copy = place / "upload.png"
        upload_copy.write_bytes(upload.read_bytes())
        kind, message = as_writer_without_rights(ds, lambda: add_files(ds, [("a.png", upload_copy)]))
        assert kind == "LibraryError" and "read-only" in message and str(ds) in message, (kind, message)
        assert sorted(p.name for p in ds.rglob("*")) == before


def test_exclude_moves_a_duplicate_out_of_training_and_restore_brings_it_back(tmp_path):
    from trainer_backend.workbench.index import list_images
    from trainer_backend.workbench.library import exclude, excluded, restore
    ds = create_dataset(tmp_path, "ds")
    write_dataset(ds / "10_dog", 2)
    exclude(ds, "10_dog/img_00001.png")
    assert [p.name for p in list_images(ds)] == ["img_00000.png"]          # the trainer's walk no longer sees it
    assert excluded(ds) == ["10_dog/img_00001.png"] and not (ds / "10_dog" / "img_00001.txt").exists()
    with pytest.raises(LibraryError, match="not an image of ds"):
        exclude(ds, "../elsewhere.png")
    restore(ds, "10_dog/img_00001.png")
    assert (ds / "10_dog" / "img_00001.txt").read_text() == "a photo, pattern 1" and excluded(ds) == []
