"""Context's ports: the names Node binds are the annotated callables of the class."""

from __future__ import annotations

import ast

from disque_py.core import context


def test_ports_are_the_annotated_callables():
    # Read from the source: a compiled Context has no __annotations__ to compare with.
    tree = ast.parse(open(context.__file__.rsplit(".", 1)[0].split(".cpython")[0] + ".py").read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Context")
    annotated = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    assert annotated == list(context.PORTS)


def test_an_unbound_port_says_so():
    ctx = context.Context("a" * 40, b"seed", 0, 0, ("127.0.0.1", 7711))
    for name in context.PORTS:
        try:
            getattr(ctx, name)(None)
        except RuntimeError as e:
            assert "before Node bound it" in str(e)
        else:
            raise AssertionError("%s ran unbound" % name)
