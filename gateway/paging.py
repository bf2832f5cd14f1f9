"""Keyset pages for the list endpoints: ``limit`` items after the previous page's cursor, and
the headers that give the next page's cursor (``x-next-cursor``, and a ``Link`` with
``rel="next"``). A keyset page is stable under writes: an item that exists from the first page
to the last is on exactly one page, whatever is added or deleted meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from fastapi import Request, Response

T = TypeVar("T")
MAX_PAGE = 1000
NEXT_PAGE_DOC = ("With ``limit``, one page: when more follow, the header ``x-next-cursor`` (and a ``Link`` "
                 "with ``rel=\"next\"``) gives the ``cursor`` of the next")


def one_page(rows: Sequence[T], limit: int | None, request: Request, response: Response,
             cursor_of: Callable[[T], str]) -> list[T]:
    """``rows`` read with ``limit + 1`` (one more than a page, to know whether another follows),
    cut to the page; when another follows, its cursor goes out in the headers."""
    if limit is None or len(rows) <= limit:
        return list(rows)
    page = list(rows[:limit])
    link_next(request, response, cursor_of(page[-1]))
    return page


def link_next(request: Request, response: Response, cursor: str) -> None:
    """Gives the next page's ``cursor`` in ``x-next-cursor`` and a ``Link`` to it (this URL with it)."""
    response.headers["x-next-cursor"] = cursor
    response.headers["link"] = f'<{request.url.include_query_params(cursor=cursor)}>; rel="next"'
