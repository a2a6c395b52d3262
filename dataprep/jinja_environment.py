"""The sandbox a user's chat template renders in: transformers' ``ImmutableSandboxedEnvironment``
(its extensions and globals: ``{% generation %}``, loop controls, ``raise_exception``,
``strftime_now``, ``tojson``) with every call, lookup, operation, concatenation, filter and
``range`` counted against the render's time and size limits (:mod:`dataprep.template_limits`),
so that no template can exhaust memory or hang a run."""

from __future__ import annotations

import functools
import json
from collections.abc import Sized
from datetime import datetime

from dataprep.template_limits import (
    TemplateLimit,
    bounded_call,
    bounded_range,
    check_result,
    check_value,
    tick,
)

__all__ = ["GEN_CLOSE", "GEN_OPEN", "jinja_environment"]

GEN_OPEN, GEN_CLOSE = "\ue000", "\ue001"


def jinja_environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension
    from jinja2.runtime import str_join
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}``: marks the assistant's trained text."""

        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            return GEN_OPEN + caller() + GEN_CLOSE

    class BoundedCodeGenerator(CodeGenerator):
        """``a ~ b`` compiled to ``environment.concat``, where its size is checked."""

        def visit_Concat(self, node, frame):
            self.write("environment.concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class Bounded(ImmutableSandboxedEnvironment):
        """The sandbox transformers uses, with every call, lookup and operation counted
        against the render's time and size limits (:mod:`dataprep.template_limits`)."""

        intercepted_binops = frozenset({"*", "**", "+", "%"})
        code_generator_class = BoundedCodeGenerator

        def call_binop(self, context, operator, left, right):
            check_result(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):
            tick()
            method = getattr(__obj, "__wrapped__", __obj)  # str.format: the sandbox's wrapper
            name = getattr(method, "__name__", "call")
            args = _materialized(name, args)
            return bounded_call(
                name,
                lambda *a, **k: super(Bounded, __self).call(__context, __obj, *a, **k),
                getattr(method, "__self__", None),
                args,
                kwargs,
            )

        def concat(self, parts):
            """``a ~ b``: refused when the joined text would pass the size limit."""
            check_value(parts, "the template's ~")
            return str_join(parts)

        def getattr(self, obj, attribute):
            tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            tick()
            return super().getitem(obj, argument)

    def strftime_now(fmt):
        if not isinstance(fmt, str) or len(fmt) > 256:
            raise TemplateLimit("strftime_now was given a format longer than 256 characters")
        return datetime.now().strftime(fmt)

    def finalize(value):
        check_value(value, "the template's {{ ... }}")
        return value

    env = Bounded(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Generation, jinja2.ext.loopcontrols],
        finalize=finalize,
    )
    env.filters["tojson"] = tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["range"] = bounded_range
    return env


def _materialized(name: str, args: tuple) -> tuple:
    """A ``join`` over an iterator (a ``range``): its items in a list, so the size check counts
    them (at most the sandbox's 100000 a range may have)."""
    if name == "join" and args and not isinstance(args[0], Sized):
        return (list(args[0]), *args[1:])
    return args


def _bounded_filter(name: str, f):
    """A filter called through :func:`bounded_call`: the context Jinja passes first to some
    filters is left out of the checks."""
    from jinja2.utils import _PassArg

    skip = 1 if _PassArg.from_obj(f) is not None else 0

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        lead = args[:skip]
        value, *rest = _materialized(name, args[skip:])
        return bounded_call(
            name, lambda *a, **k: f(*lead, value, *a, **k), value, tuple(rest), kwargs
        )

    return wrapper
