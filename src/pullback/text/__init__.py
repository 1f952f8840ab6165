"""The text format: ``astext`` prints modules, functions and expressions; ``parse`` reads them back.

This layer sits above ``ops`` (the parser looks operators up by name); importing
it installs the printer that ``repr`` of IR nodes and ``IRModule.astext`` use.
"""

from ..ir.expr import install_printer
from .parser import parse, parse_expr
from .printer import astext, binding_text

install_printer(astext)

__all__ = ["astext", "binding_text", "parse", "parse_expr"]
