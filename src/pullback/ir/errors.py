"""Exceptions raised by pullback. Every error a user can cause is one of these."""

from __future__ import annotations


class PullbackError(Exception):
    """Base class of every error pullback raises on bad input."""


class AttrError(PullbackError, ValueError):
    """An operator attribute is invalid (names the op and the attribute)."""


class TypeInferenceError(PullbackError):
    """Type inference failed: names the op, the argument types and the function."""


class WellFormedError(PullbackError):
    """The IR breaks a structural rule (unbound var, dangling GlobalVar, ...)."""


class ParseError(PullbackError):
    """Malformed program text; carries ``line`` and ``column`` (1-based)."""

    def __init__(self, message: str, line: int = 0, column: int = 0, source_name: str = "<string>"):
        self.message = message
        self.line = line
        self.column = column
        self.source_name = source_name
        super().__init__(f"{source_name}:{line}:{column}: {message}")


class ExecutionError(PullbackError):
    """Running a compiled program failed (bad inputs, kernel error)."""


class PassError(PullbackError):
    """A pass was misused (unknown function, bad option, ...)."""


class DiagnosticError(PullbackError):
    """Several problems reported at once; ``diagnostics`` lists each one."""

    def __init__(self, header: str, diagnostics: list[str]):
        self.header = header
        self.diagnostics = list(diagnostics)
        lines = [f"{header} ({len(self.diagnostics)} problem{'s' if len(self.diagnostics) != 1 else ''}):"]
        lines += [f"  - {d}" for d in self.diagnostics]
        super().__init__("\n".join(lines))


class TypeCheckError(DiagnosticError, TypeInferenceError):
    """Type inference found problems: every independent one, each naming its function and
    ``line:column`` (``diagnostics``). With one problem, the message is that problem alone."""

    def __init__(self, header: str, diagnostics: list[str]):
        super().__init__(header, diagnostics)
        if len(self.diagnostics) == 1:
            self.args = (self.diagnostics[0],)

    def __str__(self) -> str:
        return self.args[0] if self.args else ""
