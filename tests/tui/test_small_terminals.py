"""The app in small terminals: the editor, the newest message and the status stay on screen and readable."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from pilot_steps import send

from localchat.tui.app import ChatApp
from localchat.tui.widgets.messages import AssistantMessage, ConversationView, UserMessage
from localchat.tui.widgets.sidebar import ConversationList
from localchat.tui.widgets.status import StatusBar

pytestmark = pytest.mark.anyio
MakeApp = Callable[..., ChatApp]


@pytest.mark.parametrize("size", [(50, 16), (40, 12)])
async def test_the_editor_the_newest_answer_and_the_status_fit(make_app: MakeApp, size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await send(pilot, "What is the capital of France?")
        await send(pilot, "And of Japan?")
        await pilot.pause()
        screen, view = app.screen.region, app.query_one(ConversationView).region
        status = app.query_one(StatusBar)
        answer, question = app.query(AssistantMessage).last(), app.query(UserMessage).last()
        # The conversation has the width (the list is hidden) and shows the newest turn whole.
        assert not app.query_one(ConversationList).display and view.width == size[0]
        assert screen.contains_region(view) and view.contains_region(answer.region) and view.contains_region(question.region)
        # The editor: on screen, over neither the conversation nor the status, a line to type in.
        prompt = app.prompt.region
        assert screen.contains_region(prompt) and app.prompt.content_size.height >= 1 and app.prompt.content_size.width >= size[0] - 4
        assert not prompt.overlaps(view) and not prompt.overlaps(status.region)
        # The status: on screen, its figures whole, even as wide as they get on a bigger model.
        assert screen.contains_region(status.region) and status.region.height == 1
        status.tokens_per_s, status.rss_bytes = 123.4, int(1.2 * 1024**3)
        line = status.line(status.content_size.width).plain
        assert len(line) <= status.content_size.width <= size[0], line  # nothing cut at the edge
        assert re.match(rf"ready\s+[\d.]+ ?t(ok)?/s\s+ctx {status.context_used}/{status.context_size}\s+RAM [\d.]+[MG]( |$)", line), line
        # Ctrl+B still shows the conversation list.
        await pilot.press("ctrl+b")
        assert app.query_one(ConversationList).display and screen.contains_region(app.query_one(ConversationList).region)
