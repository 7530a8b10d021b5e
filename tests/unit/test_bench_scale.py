"""bench.scale's generated tree: a pure function of its size and seed, the same as a tar and as an
``EntrySource``."""

from __future__ import annotations

import hashlib
import io
import tarfile

from bench.scale import BIG, MAX_SIZE, MIN_SIZE, Tree, TreeSource, tar_chunks

POOL = 16 * 1024  # a small text pool: the default one takes most of a second to build


def _digest(tree: Tree) -> str:
    return hashlib.sha256(b"".join(tar_chunks(tree))).hexdigest()


def test_the_tree_is_a_function_of_its_size_and_seed():
    assert _digest(Tree(200, 1, POOL)) == _digest(Tree(200, 1, POOL))
    assert _digest(Tree(200, 1, POOL)) != _digest(Tree(200, 2, POOL))


def test_the_tar_holds_every_file_in_name_order_with_its_facts():
    tree = Tree(250, 7, POOL)
    with tarfile.open(fileobj=io.BytesIO(b"".join(tar_chunks(tree)))) as tar:
        members = tar.getmembers()
        files = [m for m in members if m.isfile()]
        assert [m.name for m in members if m.isdir()] == [BIG, "shard-00000"]
        assert [m.name for m in files] == [tree.path(i) for i in range(250)]
        assert sum(m.name.startswith(BIG + "/") for m in files) == 25
        for i in (0, 24, 25, 249):
            facts = tree.facts(i)
            assert MIN_SIZE <= facts.size <= MAX_SIZE
            member = files[i]
            assert (member.size, member.mtime, member.mode) == (facts.size, facts.mtime, 0o644)
            assert tar.extractfile(member).read() == tree.content(i, facts)


def test_the_entry_source_lists_the_same_tree_in_strictly_increasing_names():
    tree = Tree(250, 7, POOL)
    source = TreeSource(tree)
    dirs = [item.rel for item in source.children(source.root().rel)]
    assert dirs == [b"big", b"shard-00000"]
    rels = []
    for d in dirs:
        names = [item.name for item in source.children(d)]
        assert names == sorted(set(names))
        rels += [item.rel.decode() for item in source.children(d)]
    assert rels == [tree.path(i) for i in range(250)]
