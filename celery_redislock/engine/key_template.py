"""Limit names built from a task's arguments: templates and callables, checked once.

A template such as ``"t:{tenant}:{user}"`` is a :meth:`str.format` template over the
task's argument names. Three rules make the names it gives safe to share a store:

* **Distinct arguments never share a name.** Each substituted value has the characters
  of :data:`ESCAPED` written as ``%XX`` (percent-encoding of their byte), so a value
  can never contain a separator: ``("acme:bob", "x")`` gives ``t:acme%3Abob:x`` and
  ``("acme", "bob:x")`` gives ``t:acme:bob%3Ax``. Other characters are kept, so names
  stay readable. Two fields must be separated by one of :data:`SEPARATORS`.
* **Secrets stay out of key names.** ``{api_token:hash}`` substitutes the first
  :data:`HASH_LENGTH` hex digits of the SHA-256 of the value's text instead of the value.
* **Mistakes surface at definition.** Fields must be argument names of the task,
  conversions ``!r``, ``!s`` or ``!a``, format specs fixed (no nested ``{}``) and able to
  format some value; a callable must take the task's arguments it asks for by name.

Values with the same text share a name (``42`` and ``"42"``), as do values a format spec
makes equal (``{x:.1f}``): the name is made of the values' text.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import string
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import LockConfigurationError, LockKeyError

KeySource = Union[str, Callable[..., Any], None]

#: Characters written as ``%XX`` in every value a template substitutes.
ESCAPED = "%:/{}"

#: What may separate two fields of a template: characters no escaped value contains.
SEPARATORS = ":/{}"

#: The format spec that substitutes a digest of the value instead of the value.
HASH_SPEC = "hash"

#: Hex digits of SHA-256 kept by ``{field:hash}`` (64 bits).
HASH_LENGTH = 16

#: What a substituted value looks like in a name: no separator, ``%`` only as ``%XX``.
_VALUE_PATTERN = r"(?:[^%:/{}]|%[0-9A-F]{2})*"
#: What ``{field:hash}`` substitutes.
_DIGEST_PATTERN = f"[0-9a-f]{{{HASH_LENGTH}}}"

_ESCAPES = {ord(char): f"%{ord(char):02X}" for char in ESCAPED}
_FORMATTER = string.Formatter()
_SAMPLES: Tuple[Any, ...] = ("x", 1, 1.5)
_NAMED_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def escape_value(text: str) -> str:
    """``text`` with the characters of :data:`ESCAPED` written as ``%XX``.

        >>> escape_value("acme:bob"), escape_value("50%"), escape_value("a/{b}")
        ('acme%3Abob', '50%25', 'a%2F%7Bb%7D')
    """
    return text.translate(_ESCAPES)


def value_digest(text: str) -> str:
    """What ``{field:hash}`` substitutes: the first :data:`HASH_LENGTH` hex digits of the
    SHA-256 of the value's text (UTF-8), the same on every worker and Python version.

        >>> value_digest("s3cr3t")
        '4e738ca5563c06cf'
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LENGTH]


@dataclass(frozen=True)
class _Part:
    """Literal text, then (unless ``field`` is None) one field of a template."""

    literal: str
    field: Optional[str]
    spec: str
    conversion: Optional[str]

    def render(self, values: Mapping[str, Any]) -> str:
        if self.field is None:
            return self.literal
        value, _ = _FORMATTER.get_field(self.field, (), values)
        value = _FORMATTER.convert_field(value, self.conversion)
        if self.spec == HASH_SPEC:
            return self.literal + value_digest(str(value))
        return self.literal + escape_value(format(value, self.spec))


class KeyTemplate:
    """Builds a limit name from the arguments of one call of a task.

    ``source`` is ``None`` (the name is ``default``, normally the task's name), a
    template over the function's argument names, or a callable that is given the task's
    arguments by name (bound to the task's signature, defaults applied; only those it
    takes, unless it takes ``**kwargs``) and returns the name. Everything is checked
    here, once, so a mistake surfaces when the task is defined::

        >>> def sync_customer(customer_id, full=False): ...
        >>> key = KeyTemplate("customer:{customer_id}", sync_customer, owner="sync")
        >>> key.render((42,), {}) == key.render((), {"customer_id": 42})
        True
        >>> key.render(("a:b",), {})
        'customer:a%3Ab'
        >>> KeyTemplate(lambda customer_id: f"c-{customer_id}", sync_customer,
        ...             owner="sync").render((7, True), {})
        'c-7'
    """

    def __init__(self, source: KeySource, func: Callable[..., Any], *, owner: str,
                 default: Optional[str] = None, option: str = "lock_key") -> None:
        self.source = source
        self.owner = owner
        self._default = default if default is not None else owner
        self._parts: Tuple[_Part, ...] = ()
        self._passes: Optional[Tuple[str, ...]] = None  # a callable's names; None: all
        #: The name of a template with no field (the same for every call), else None.
        self._literal: Optional[str] = None
        if source is None:
            return
        if not callable(source) and not isinstance(source, str):
            raise LockConfigurationError(f"{owner}: {option} must be a template string or a "
                                         f"callable, not {type(source).__name__}")
        if isinstance(source, str) and not source:
            raise LockConfigurationError(f"{owner}: {option} must not be empty")
        signature = self._signature = _signature_of(func, owner, option)
        if callable(source):
            problems = self._check_callable(source, signature, option)
        else:
            problems = self._check_template(source, signature, option)
        if problems:
            raise LockConfigurationError.listing(owner, problems)

    @property
    def is_constant(self) -> bool:
        """True when every call gets the same name: no template, or one with no field
        (no callable).

            >>> def sync_customer(customer_id): ...
            >>> KeyTemplate("customers", sync_customer, owner="sync").is_constant
            True
        """
        return self.source is None or self._literal is not None

    def render(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
               partial: bool = False) -> str:
        """The limit name for one call; raises :class:`LockKeyError` if it cannot be built.

        ``partial=True`` needs only the arguments the key uses (the fields of a template,
        the arguments a callable asks for): what an operator or a task body that names a
        key (``pause_key_of(self, token, ...)``) gives.

            >>> def call_api(token, payload): ...
            >>> KeyTemplate("api:{token}", call_api, owner="api").render(
            ...     ("t1",), {}, partial=True)
            'api:t1'
        """
        if self.source is None:
            return self._default
        if self._literal is not None:  # no field: the arguments make no difference
            return self._literal
        if partial:
            self._check_given(args, kwargs)
        try:
            values = self._arguments(args, kwargs, partial=partial)
            if callable(self.source):
                if self._passes is not None:
                    values = {name: values[name] for name in self._passes if name in values}
                name = str(self.source(**values))
            else:
                name = "".join(part.render(values) for part in self._parts)
        except LockKeyError:
            raise
        except Exception as exc:
            raise LockKeyError(
                f"{self.owner}: could not build the lock key from {self._described()} for a "
                f"call with {len(args)} positional argument(s) and keyword(s) "
                f"{sorted(kwargs)}: {type(exc).__name__}: {exc}"
            ) from exc
        if not name:
            raise LockKeyError(f"{self.owner}: lock key {self._described()} gave an empty name")
        return name

    def arguments_for(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        """What a callable source is given for one call: the task's arguments by name
        (defaults applied), only those it takes unless it takes ``**kwargs``. Raises what
        binding the arguments to the task's signature raises (``TypeError``)."""
        values = self._arguments(args, kwargs)
        if self._passes is not None:
            values = {name: values[name] for name in self._passes if name in values}
        return values

    def _described(self) -> str:
        if callable(self.source):
            return getattr(self.source, "__qualname__", type(self.source).__name__) + "()"
        return repr(self.source)

    def could_render(self, name: str) -> Optional[bool]:
        """Whether some call could give limit name ``name``: True or False for a template
        (or no key), None for a callable (it cannot say).

            >>> def sync_customer(customer_id, full=False): ...
            >>> key = KeyTemplate("customer:{customer_id}", sync_customer, owner="sync")
            >>> key.could_render("customer:999"), key.could_render("customer:9:9")
            (True, False)
        """
        if self.source is None:
            return name == self._default
        if callable(self.source):
            return None
        return self._pattern().match(name) is not None

    def _pattern(self) -> re.Pattern[str]:
        parts = []
        for part in self._parts:
            parts.append(re.escape(part.literal))
            if part.field is not None:
                parts.append(_DIGEST_PATTERN if part.spec == HASH_SPEC else _VALUE_PATTERN)
        return re.compile("".join(parts) + r"\Z")

    def _check_given(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise :class:`LockKeyError` naming a template field that ``args``/``kwargs``
        leave out (for a partial render)."""
        if callable(self.source):
            return
        try:
            given = self._signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return  # render says what is wrong
        defaults = {name for name, p in self._signature.parameters.items()
                    if p.default is not inspect.Parameter.empty}
        for part in self._parts:
            root = _field_root(part.field) if part.field is not None else None
            if root is not None and root not in given and root not in defaults \
                    and root not in kwargs:
                raise LockKeyError(
                    f"{self.owner}: lock key {self._described()} needs argument {root!r}, "
                    "which this call does not give")

    def _arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
                   partial: bool = False) -> Dict[str, Any]:
        bind = self._signature.bind_partial if partial else self._signature.bind
        bound = bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for name, parameter in self._signature.parameters.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                values.update(values.pop(name, {}))
        return values

    def _check_template(self, template: str, signature: inspect.Signature,
                        option: str) -> List[str]:
        where = f"{self.owner}: {option} {template!r}"
        try:
            parsed = list(_FORMATTER.parse(template))
        except ValueError as exc:
            return [f"{where} is not a valid template: {exc}"]
        self._parts = tuple(_Part(literal, field, spec or "", conversion)
                            for literal, field, spec, conversion in parsed)
        problems: List[str] = []
        fields = [part for part in self._parts if part.field is not None]
        if not fields:
            self._literal = "".join(part.literal for part in self._parts)
        for part in fields:
            problems.extend(_field_problems(part, signature, where))
        for before, after in zip(fields, fields[1:]):
            if not any(char in after.literal for char in SEPARATORS):
                problems.append(
                    f"{where} puts {{{before.field}}} and {{{after.field}}} side by side: "
                    "separate fields by ':' or '/', so that distinct arguments always give "
                    "distinct keys"
                )
        return problems

    def _check_callable(self, source: Callable[..., Any], signature: inspect.Signature,
                        option: str) -> List[str]:
        try:
            parameters = inspect.signature(source).parameters.values()
        except (TypeError, ValueError) as exc:
            return [f"{self.owner}: cannot read the arguments of the {option} callable: {exc}"]
        accepted = _argument_names(signature)
        takes_any = _takes_any_keyword(signature)
        problems = []
        names = []
        for parameter in parameters:
            required = parameter.default is inspect.Parameter.empty
            if parameter.kind in _NAMED_KINDS:
                names.append(parameter.name)
                if required and parameter.name not in accepted and not takes_any:
                    problems.append(
                        f"{self.owner}: {option} callable needs argument {parameter.name!r}, "
                        f"which the task does not take (it takes: "
                        f"{', '.join(accepted) or 'no arguments'})"
                    )
            elif parameter.kind is inspect.Parameter.POSITIONAL_ONLY and required:
                problems.append(
                    f"{self.owner}: {option} callable takes {parameter.name!r} positionally "
                    "only; it is given the task's arguments by name"
                )
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            self._passes = tuple(names)
        return problems


def _field_problems(part: _Part, signature: inspect.Signature, where: str) -> List[str]:
    """What is wrong with one field of a template (nothing, usually)."""
    assert part.field is not None
    problems = []
    if part.conversion not in (None, "r", "s", "a"):
        problems.append(f"{where} has an unknown conversion !{part.conversion} "
                        "(use !r, !s or !a)")
    root = _field_root(part.field)
    accepted = _argument_names(signature)
    if not root or root.isdigit():
        example = accepted[0] if accepted else "argument_name"
        problems.append(f"{where} uses a positional field {{{part.field}}}; name the "
                        f"argument instead, e.g. {{{example}}}")
    elif root not in accepted and not _takes_any_keyword(signature):
        problems.append(f"{where} names argument {root!r}, which the task does not take "
                        f"(it takes: {', '.join(accepted) or 'no arguments'})")
    if "{" in part.spec:
        problems.append(f"{where} puts a field inside the format spec of {{{part.field}}}; "
                        "a key's format spec is fixed, such as {n:>5}")
    elif part.spec and part.spec != HASH_SPEC and not _formats_some_value(part.spec):
        problems.append(f"{where} has a format spec ':{part.spec}' that formats no value "
                        f"(use ':{HASH_SPEC}' for a digest of the value)")
    return problems


def _formats_some_value(spec: str) -> bool:
    """True when ``spec`` formats a str, an int or a float, or may be a date's pattern."""
    if "%" in spec:
        return True
    for sample in _SAMPLES:
        try:
            format(sample, spec)
        except (ValueError, TypeError):
            continue
        return True
    return False


def _argument_names(signature: inspect.Signature) -> List[str]:
    return [name for name, p in signature.parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def _takes_any_keyword(signature: inspect.Signature) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())


def _field_root(field: str) -> str:
    for index, char in enumerate(field):
        if char in ".[":
            return field[:index]
    return field


def _signature_of(func: Callable[..., Any], owner: str, option: str) -> inspect.Signature:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise LockConfigurationError(
            f"{owner}: cannot read the task's arguments to check {option}: {exc}"
        ) from exc
