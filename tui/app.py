"""The chat app: a conversation list, the open conversation, a message editor and a status bar.

The app is the controller: widgets only show things and post messages. The model is loaded and
replies are generated in thread workers that talk back through `post_message` only; each
finished message goes to the conversation store in its own transaction.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Footer, Label, ProgressBar
from textual.worker import get_current_worker

from localchat.adapters import LoraSpec
from localchat.chat_engine import ChatEngine, EngineChat
from localchat.conversation import OpenConversation, Turn
from localchat.engine import Engine
from localchat.errors import LocalchatError
from localchat.hardware import gpu_memory_used_bytes, process_rss_bytes
from localchat.history import ConversationStore
from localchat.hub import HubModelName, PullCancelled, cached_models, pull
from localchat.models import DEFAULT_MODEL_FILE, DEFAULT_MODEL_NAME, local_models
from localchat.planner import PlanRequest
from localchat.remote import RemoteEndpoint, RemoteServer
from localchat.reply_parser import (
    ContentDelta,
    ParsedReply,
    ReasoningDelta,
    ReplyParser,
    ReplyPart,
)
from localchat.session import GenerationSettings, GenerationStats
from localchat.settings import Settings
from localchat.speculative import DEFAULT_LOOKUP_DRAFT
from localchat.tui.widgets.dialogs import (
    Confirm,
    HelpScreen,
    ModelChoice,
    ModelPicker,
    SystemPromptEditor,
    TextPrompt,
)
from localchat.tui.widgets.messages import (
    AssistantMessage,
    ContextStart,
    ConversationView,
    Notice,
    Reasoning,
    UserMessage,
)
from localchat.tui.widgets.prompt import PromptInput
from localchat.tui.widgets.sidebar import ConversationList
from localchat.tui.widgets.status import StatusBar

REPLY_SETTINGS = GenerationSettings(max_tokens=1024, lookup_draft=DEFAULT_LOOKUP_DRAFT)
# Text reaches the screen at most this often; MarkdownStream merges what piles up in between.
FRAME_S = 1 / 30
# The status bar's live numbers (tokens/s, context) update this often while a reply is written.
STATS_S = 0.25
MEMORY_S = 1.0
WELCOME = "Type a message and press Enter to send it; Ctrl+J adds a new line. F1 lists every key."
UNANSWERED = "This message has no answer: localchat stopped while writing it. Ctrl+R writes one."
# Keys handled by the message editor itself, for the help screen.
EDITOR_KEYS = [("Enter", "send the message"), ("Ctrl+J / Shift+Enter", "new line in the message")]
THEMES = ("textual-dark", "textual-light")


# Messages from the worker threads to the app.


@dataclass
class ReplyText(Message):
    text: str


@dataclass
class ReplyStats(Message):
    tokens_per_s: float
    ttft_s: float | None
    context_used: int | None


@dataclass
class ReplyEnded(Message):
    error: str | None


@dataclass
class LoadProgress(Message):
    fraction: float


@dataclass
class ModelLoaded(Message):
    engine: ChatEngine
    label: str


@dataclass
class ModelFailed(Message):
    label: str
    error: str


@dataclass
class PullProgress(Message):
    done: int
    total: int | None


@dataclass
class PullEnded(Message):
    name: str  # the model's name in the cache once pulled, else the name asked for
    error: str | None
    cancelled: bool = False


@dataclass
class Reply:
    """A reply being generated (the turn that stores it) and where it is drawn."""

    turn: Turn
    widget: AssistantMessage
    parser: ReplyParser  # the text as it reaches the view -> reasoning and content
    parsed: ParsedReply = field(default_factory=ParsedReply)
    thinking: Reasoning | None = None  # mounted above the answer once reasoning arrives
    done: threading.Event = field(default_factory=threading.Event)


def key_label(keys: str) -> str:
    """Textual key names as a person reads them: "ctrl+q,f1" -> "Ctrl+Q / F1"."""
    names = {"escape": "Esc", "enter": "Enter", "delete": "Delete"}
    labels = []
    for key in keys.split(","):
        parts = key.split("+")
        labels.append("+".join(names.get(p, p.upper() if len(p) <= 2 else p.capitalize()) for p in parts))
    return " / ".join(labels)


class ChatApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "localchat"
    # Footer labels stay short to fit 80 columns; the help screen shows the tooltips.
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", tooltip="quit; a reply being written is kept", priority=True),
        Binding("f1", "help", "Help", tooltip="show these keys"),
        Binding("escape", "stop", "Stop", tooltip="stop the reply and keep what was written"),
        Binding("ctrl+n", "new_chat", "New", tooltip="start a new conversation", priority=True),
        Binding("ctrl+r", "regenerate", "Regen", tooltip="write the last answer again", priority=True),
        Binding("ctrl+g", "copy_answer", "Copy", tooltip="copy the last answer to the clipboard", priority=True),
        Binding("ctrl+o", "pick_model", "Model", tooltip="choose and load another model", priority=True),
        Binding("ctrl+s", "system_prompt", "System", tooltip="edit this conversation's system prompt", show=False),
        Binding("ctrl+l", "focus_list", "List", tooltip="go to the conversation list", show=False, priority=True),
        Binding("f2", "rename", "Rename", tooltip="rename this conversation", show=False),
        Binding("f8", "delete", "Delete", tooltip="delete this conversation", show=False),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", tooltip="show or hide the conversation list", show=False, priority=True),
        Binding("ctrl+t", "toggle_theme", "Theme", tooltip="switch between dark and light themes", show=False, priority=True),
        Binding("f3", "toggle_thinking", "Think", tooltip="turn the model's thinking on or off", show=False),
    ]

    def __init__(
        self,
        settings: Settings,
        *,
        model: str | None = None,
        request: PlanRequest = PlanRequest(),
        engine: ChatEngine | None = None,
        remote: RemoteEndpoint | None = None,
        store: ConversationStore | None = None,
        reply_settings: GenerationSettings = REPLY_SETTINGS,
        draft_model: str | None = None,
        loras: tuple[LoraSpec, ...] = (),
    ) -> None:
        """Loads `model` on start (or connects to `remote`), or uses `engine` as given (the caller
        then closes it). `draft_model` drafts for `model` (speculative decoding) and `loras` adapt
        it, not models picked later: a draft model must share its target's vocabulary, an adapter
        its base model's tensors."""
        super().__init__()
        self.reply_settings = reply_settings
        self.last_stats: GenerationStats | None = None
        self.settings = settings
        self.request = request
        self.engine = engine
        self.remote = remote
        if engine is not None:
            label = engine.model_name
        elif remote is not None:
            label = remote.base_url + (f"#{remote.model}" if remote.model else "")
        else:
            label = model or DEFAULT_MODEL_NAME
        self.model_label = label
        self._model_arg = model
        self._draft_model = draft_model
        self._loras = loras
        self._owned: set[int] = set()  # ids of engines this app loaded and must close
        self.store = store or ConversationStore.open(settings)
        self._owns_store = store is None
        self.conversation: OpenConversation | None = None
        self.reply: Reply | None = None
        self.loading = False
        self.thinking = True  # the stored preference replaces it on mount
        self._pull_cancel: threading.Event | None = None  # set to stop the pull under way
        self._quit_after_reply = False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Behind a dialog only quitting and moving the focus work: no second dialog over the first,
        # no hidden sends.
        if isinstance(self.screen, ModalScreen) and action not in ("quit", "focus_next", "focus_previous"):
            return False
        return True

    # Layout

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield ConversationList(id="conversations")
            with Vertical(id="main"):
                yield ConversationView(id="view")
                with Horizontal(id="load"):
                    yield Label("Loading", id="load-label")
                    yield ProgressBar(total=1.0, show_eta=False)
                yield PromptInput(id="prompt", placeholder="Message the model…")
        yield StatusBar()
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        if (theme := self.store.preference("theme")) in self.available_themes:
            self.theme = theme
        # Ctrl+T or the command palette: either way the next start opens in the same theme.
        self.theme_changed_signal.subscribe(self, lambda chosen: self.store.set_preference("theme", chosen.name))
        self.thinking = self.store.preference("thinking") != "off"
        self.query_one("#conversations").border_title = "Conversations"
        self.status = self.query_one(StatusBar)
        self.conversation_view = self.query_one(ConversationView)
        self.prompt = self.query_one(PromptInput)
        self.memory_timer = self.set_interval(MEMORY_S, self._sample_memory)
        self._sample_memory()
        conversations = self.store.conversations()
        await self.open_conversation(conversations[0].id if conversations else None)
        self.prompt.focus()
        if self.engine is None:
            self.load_model(self._model_arg, self.model_label)
        else:
            self._show_engine()

    # The model

    def load_model(self, model: str | None, label: str) -> None:
        self.loading = True
        self.query_one("#load-label", Label).update(f"Loading {label}")
        self.query_one(ProgressBar).update(progress=0)
        self.query_one("#load").display = True
        self.status.state = "loading"
        self._load(model, label)

    @property
    def chat(self) -> EngineChat | None:
        """The open conversation's chat on the engine (None without one)."""
        return self.conversation.chat if self.conversation is not None else None

    @work(thread=True, exclusive=True, group="load")
    def _load(self, model: str | None, label: str) -> None:
        engine: ChatEngine
        try:
            if self.remote is not None:
                engine = RemoteServer(self.remote)
            else:
                engine = Engine.load(
                    model, self.settings, self.request, on_progress=lambda f: self.post_message(LoadProgress(f)),
                    draft_model=self._draft_model if model == self._model_arg else None,
                    loras=self._loras if model == self._model_arg else (),
                )
        except (LocalchatError, OSError) as error:
            self.post_message(ModelFailed(label, str(error)))
            return
        self.post_message(ModelLoaded(engine, label))

    def on_load_progress(self, message: LoadProgress) -> None:
        self.query_one(ProgressBar).update(progress=message.fraction)

    async def on_model_loaded(self, message: ModelLoaded) -> None:
        old, self.engine = self.engine, message.engine
        self._owned.add(id(message.engine))
        if old is not None and id(old) in self._owned:
            self._owned.discard(id(old))
            old.close()
        self.model_label = message.label
        self.loading = False
        self.query_one("#load").display = False
        self._rebuild_chat()
        self._show_engine()
        self.notify(f"{message.label} is ready", timeout=2)

    async def on_model_failed(self, message: ModelFailed) -> None:
        self.loading = False
        self.query_one("#load").display = False
        if self.engine is not None:
            self._show_engine()
            what = f"kept {self.engine.model_name}"
        else:
            self.status.state = "no model"
            what = "press Ctrl+R to try again" if self.remote is not None else "press Ctrl+O to choose another model"
        text = f"Could not load {message.label}: {message.error}\n({what})"
        await self.conversation_view.mount(Notice(text, classes="error", markup=False))
        self.conversation_view.scroll_end(animate=False)
        self.notify(f"Could not load {message.label}", severity="error", timeout=5)

    def _show_engine(self) -> None:
        assert self.engine is not None
        self.status.state = "ready"
        self.status.backend = self.engine.backend_label
        self.status.model = self.engine.model_name
        self.status.context_size = self.engine.context_size or 0
        self.status.gpu_bytes = gpu_memory_used_bytes() if self.engine.uses_gpu else None
        self.prompt.placeholder = f"Message {self.engine.model_name}"
        self._show_context()

    def _show_context(self) -> None:
        """Tokens the open conversation fills in the context (the prompt for its next reply), and
        the messages that prompt leaves out."""
        if self.conversation is None:
            return
        use = self.conversation.next_context(self.reply_settings)
        if use is None:  # it no longer fits
            self.status.context_used = self.status.context_size
            return
        if use.tokens is not None:
            self.status.context_used = use.tokens
        self.status.left_out = use.left_out
        self._mark_context_start(use.left_out)

    def _mark_context_start(self, left_out: int) -> None:
        """A line above the first message the model still sees, when older ones are left out of
        its context (Chat decides which; the view only shows it)."""
        for old in self.conversation_view.query(ContextStart):
            old.remove()
        shown = self.conversation_view.query("UserMessage, AssistantMessage").nodes
        if left_out <= 0 or left_out >= len(shown) or self.engine is None or self.engine.context_size is None:
            return
        self.conversation_view.mount(ContextStart(left_out, self.engine.context_size), before=self._top_of(shown[left_out]))

    def _top_of(self, message: Widget) -> Widget:
        """A message's first widget in the view: its thinking, when an answer has some."""
        children = list(self.conversation_view.children)
        index = children.index(message)
        return children[index - 1] if index and isinstance(children[index - 1], Reasoning) else message

    def _sample_memory(self) -> None:
        self.status.rss_bytes = process_rss_bytes()
        if self.engine is not None and self.engine.uses_gpu:
            self.status.gpu_bytes = gpu_memory_used_bytes()

    # Conversations

    def _rebuild_chat(self) -> None:
        if self.conversation is not None:
            self.conversation.attach(self.engine, thinking=self.thinking)

    def _refresh_list(self) -> None:
        self.query_one(ConversationList).show(
            self.store.conversations(), self.conversation.id if self.conversation else None
        )

    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation, or a fresh one when `conversation_id` is None."""
        self._stop_reply()
        self.conversation = OpenConversation.open(self.store, conversation_id, self.engine, thinking=self.thinking)
        stored = self.conversation.messages()
        widgets: list[Widget] = []
        for m in stored:
            if m.reasoning:
                widgets.append(Reasoning(m.reasoning, self._token_count(m.reasoning)))
            widgets.append(UserMessage(m.content) if m.role == "user" else AssistantMessage(m.content))
        await self.conversation_view.remove_children()
        if stored and stored[-1].role == "user":
            widgets.append(Notice(UNANSWERED, id="unanswered"))
        await self.conversation_view.mount_all(widgets or [Notice(WELCOME, id="welcome")])
        self.conversation_view.scroll_end(animate=False)
        self._refresh_list()
        if self.engine is not None:
            self._show_context()
        self.status.tokens_per_s = self.status.ttft_s = None

    @on(ConversationList.Chosen)
    async def _chosen(self, message: ConversationList.Chosen) -> None:
        if self.conversation is None or message.conversation_id != self.conversation.id:
            await self.open_conversation(message.conversation_id)
        self.prompt.focus()

    @on(ConversationList.Action)
    def _list_action(self, message: ConversationList.Action) -> None:
        if message.action == "rename":
            self._rename(message.conversation_id)
        else:
            self._delete(message.conversation_id)

    async def action_new_chat(self) -> None:
        if self.conversation is not None and self.conversation.is_empty():
            self.prompt.focus()
            return  # the open conversation is already a new one
        await self.open_conversation(None)
        self.prompt.focus()

    def action_rename(self) -> None:
        if self.conversation is not None:
            self._rename(self.conversation.id)

    def _rename(self, conversation_id: int) -> None:
        conversation = self.store.get(conversation_id)
        if conversation is None:
            return

        def done(title: str | None) -> None:
            if title is not None:
                self.store.rename(conversation_id, title)
                if self.conversation and self.conversation.id == conversation_id:
                    self.conversation.reload()
                self._refresh_list()

        self.push_screen(TextPrompt("Rename the conversation", conversation.title), done)

    def action_delete(self) -> None:
        if self.conversation is not None:
            self._delete(self.conversation.id)

    def _delete(self, conversation_id: int) -> None:
        conversation = self.store.get(conversation_id)
        if conversation is None:
            return

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            if self.reply is not None and self.reply.turn.conversation_id == conversation_id:
                self._stop_reply()  # its end finds the conversation gone and stores nothing
            self.store.delete(conversation_id)
            if self.conversation and self.conversation.id == conversation_id:
                rest = self.store.conversations()
                await self.open_conversation(rest[0].id if rest else None)
            else:
                self._refresh_list()

        self.push_screen(Confirm(f"Delete “{conversation.title}”?"), done)

    def action_system_prompt(self) -> None:
        if self.conversation is None:
            return
        conversation_id = self.conversation.id

        def done(text: str | None) -> None:
            if text is None:
                return
            self.store.set_system_prompt(conversation_id, text)
            if self.conversation and self.conversation.id == conversation_id:
                self.conversation.reload()
                if self.reply is None:
                    self._rebuild_chat()
                    if self.engine is not None:
                        self._show_context()
            self.notify("System prompt saved" if text else "System prompt removed", timeout=2)

        self.push_screen(SystemPromptEditor(self.conversation.system_prompt), done)

    def action_focus_list(self) -> None:
        listing = self.query_one(ConversationList)
        listing.display = True
        listing.focus()

    def action_toggle_sidebar(self) -> None:
        listing = self.query_one(ConversationList)
        listing.display = not listing.display
        if not listing.display:
            self.prompt.focus()

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    def action_toggle_thinking(self) -> None:
        """Thinking on or off for the next replies, kept for the next start; only templates that
        read `enable_thinking` can turn it off (a server's is only asked)."""
        if self.reply is not None:
            self.notify("A reply is being written; Esc stops it.", timeout=3)
            return
        self.thinking = not self.thinking
        self.store.set_preference("thinking", "on" if self.thinking else "off")
        self._rebuild_chat()
        if self.engine is not None:
            self._show_context()
        said = "Thinking on" if self.thinking else "Thinking off"
        engine = self.engine
        if engine is not None and not engine.can_switch_thinking:
            self.notify(f"{said}, but {engine.model_name}'s chat template has no switch for it", timeout=5)
        elif engine is not None and not engine.thinking_switch_checked:
            self.notify(f"{said}: asked of the server ({engine.backend_label}); a chat template without the switch "
                        "ignores it", timeout=5)
        else:
            self.notify(said, timeout=2)

    # Replies

    @on(PromptInput.Submitted)
    async def _submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text.strip()
        if not text:
            return
        if not self._can_generate():
            return
        assert self.conversation is not None
        try:
            sent = self.conversation.send(text, self.reply_settings)
        except LocalchatError as error:
            self.notify(str(error), title="Not sent", severity="error", timeout=8)
            return
        if sent.filled_unanswered:
            await self.conversation_view.mount(AssistantMessage())
        self.prompt.clear()
        await self.conversation_view.query("#welcome, #unanswered").remove()
        await self.conversation_view.mount(UserMessage(text))
        await self._start_reply(sent.turn)
        self._refresh_list()

    def _can_generate(self) -> bool:
        if self.reply is not None:
            self.notify("A reply is being written; Esc stops it.", timeout=3)
        elif self.loading:
            self.notify("The model is still loading.", timeout=3)
        elif self.chat is None and self.remote is not None:
            self.notify(f"Not connected to {self.model_label}; Ctrl+R tries again.", severity="warning", timeout=5)
        elif self.chat is None:
            self.notify("No model is loaded; Ctrl+O chooses one.", severity="warning", timeout=5)
        else:
            return True
        return False

    async def action_regenerate(self) -> None:
        if self.engine is None and self.remote is not None and not self.loading:
            self.load_model(None, self.model_label)  # the remote was not reachable: try again
            return
        if not self._can_generate():
            return
        assert self.conversation is not None
        try:
            turn = self.conversation.regenerate(self.reply_settings)
        except LocalchatError as error:
            self.notify(str(error), severity="error", timeout=8)
            return
        if turn is None:
            self.notify("There is no answer to regenerate yet.", timeout=3)
            return
        answers = self.conversation_view.query(AssistantMessage)
        if turn.replacing is not None and answers:
            last = answers.last()
            top = self._top_of(last)
            if top is not last:
                await top.remove()
            await last.remove()
        await self.conversation_view.query("#unanswered").remove()
        await self._start_reply(turn)

    async def _start_reply(self, turn: Turn) -> None:
        widget = AssistantMessage()
        await self.conversation_view.mount(widget)
        await widget.start_stream()
        self.conversation_view.scroll_end(animate=False)
        self.reply = Reply(turn, widget, turn.chat.reply_parser())
        left_out = turn.chat.left_out()
        self.status.left_out = left_out
        self._mark_context_start(left_out)
        self.status.state = "writing"
        self.status.tokens_per_s = self.status.ttft_s = None
        self._generate(self.reply)

    @work(thread=True, group="reply")
    def _generate(self, reply: Reply) -> None:
        """Runs the generation; never touches a widget, only posts messages."""
        worker = get_current_worker()
        generation = reply.turn.generation
        pending: list[str] = []
        last_text = last_stats = time.monotonic()
        error = None
        try:
            for piece in generation:
                pending.append(piece)
                now = time.monotonic()
                if now - last_text >= FRAME_S:
                    self.post_message(ReplyText("".join(pending)))
                    pending.clear()
                    last_text = now
                if now - last_stats >= STATS_S:
                    self.post_message(self._stats(reply.turn))
                    last_stats = now
                if worker.is_cancelled:
                    generation.cancel()
        except LocalchatError as failure:
            error = str(failure)
        finally:
            if pending:
                self.post_message(ReplyText("".join(pending)))
            reply.done.set()
            self.post_message(ReplyEnded(error))

    @staticmethod
    def _stats(turn: Turn) -> ReplyStats:
        generation = turn.generation
        ttft = generation.first_token_at - generation.started_at if generation.first_token_at else None
        return ReplyStats(generation.tokens_per_second, ttft, turn.chat.context_used())

    async def on_reply_text(self, message: ReplyText) -> None:
        if self.reply is not None:
            await self._show_parts(self.reply, self.reply.parser.feed(message.text))

    async def _show_parts(self, reply: Reply, parts: list[ReplyPart]) -> None:
        """Content into the answer, reasoning into the folded block above it."""
        content = ""
        for part in parts:
            reply.parsed.add(part)
            if isinstance(part, ContentDelta):
                content += part.text
            elif isinstance(part, ReasoningDelta) and reply.widget.is_attached:
                if reply.thinking is None:
                    reply.thinking = Reasoning()
                    await self.conversation_view.mount(reply.thinking, before=reply.widget)
                reply.thinking.write(part.text)
        if content and reply.widget.is_attached:
            await reply.widget.write(content)

    def _shows(self, reply: Reply) -> bool:
        """Whether `reply` belongs to the conversation on screen."""
        return self.conversation is not None and reply.turn.conversation_id == self.conversation.id

    def on_reply_stats(self, message: ReplyStats) -> None:
        if self.reply is not None and self._shows(self.reply):
            self.status.tokens_per_s = message.tokens_per_s
            self.status.ttft_s = message.ttft_s
            if message.context_used is not None:
                self.status.context_used = message.context_used

    async def on_reply_ended(self, message: ReplyEnded) -> None:
        reply, self.reply = self.reply, None
        if reply is None:
            return
        stats = self.last_stats = reply.turn.generation.stats
        await self._show_parts(reply, reply.parser.finish())
        content, reasoning = reply.parsed.content, reply.parsed.reasoning
        reply.turn.end(content, reasoning)
        note = ""
        if message.error:
            note = f"error: {message.error} (Ctrl+R tries again)"
            self.notify(message.error, title="The reply failed", severity="error", timeout=8)
        elif stats is not None and stats.finish_reason == "cancelled":
            note = "stopped"
        elif stats is not None and stats.finish_reason == "length":
            note = "cut off at the length limit"
        await reply.widget.end_stream()
        if reply.thinking is not None and reply.thinking.is_attached:
            reply.thinking.finish(self._token_count(reasoning))
        if reply.widget.is_attached:  # not when the user switched conversations meanwhile
            await reply.widget.finish(content, note)
        self.status.state = "ready" if self.engine is not None else "no model"
        if stats is not None and self._shows(reply):
            self.status.tokens_per_s = stats.decode_tok_s
            self.status.ttft_s = stats.ttft_s
            if (used := reply.turn.chat.context_used()) is not None:
                self.status.context_used = used
        self._refresh_list()
        if self._quit_after_reply:
            self.exit(self.return_code or 0)

    def _token_count(self, text: str) -> int | None:
        """How many tokens `text` is for the model (None before one is loaded, or when it
        cannot count)."""
        return self.engine.token_count(text) if self.engine is not None else None

    def _stop_reply(self) -> None:
        if self.reply is not None:
            self.reply.turn.generation.cancel()

    def action_stop(self) -> None:
        if self.reply is not None:
            self._stop_reply()
        else:
            self.prompt.focus()

    def action_copy_answer(self) -> None:
        answers = [m for m in (self.chat.messages if self.chat else []) if m.role == "assistant"]
        if self.reply is not None and self.reply.parsed.content:
            text = self.reply.parsed.content
        elif answers:
            text = answers[-1].content
        else:
            self.notify("There is no answer to copy yet.", timeout=3)
            return
        self.copy_to_clipboard(text)
        self.notify(f"Copied the answer ({len(text)} characters)", timeout=2)

    # Screens

    def action_help(self) -> None:
        rows = list(EDITOR_KEYS)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            rows.append((key_label(binding.key), binding.tooltip or binding.description))
        rows.append(("r / d", "in the list: rename / delete a conversation"))
        rows.append(("Ctrl+P", "command palette: themes, keys, quit"))
        self.push_screen(HelpScreen(rows))

    def model_choices(self) -> list[ModelChoice]:
        """The default model, every GGUF file and ONNX folder in the models directory, and the
        GGUF models in the Hugging Face cache (by their hub names, which load without the network)."""
        choices = [ModelChoice(DEFAULT_MODEL_NAME, None, "default")]
        for ref in local_models(self.settings):
            if ref.path.name == DEFAULT_MODEL_FILE:
                continue  # the default model's own file
            choices.append(ModelChoice(ref.name, str(ref.path), ref.format))
        for cached in cached_models(self.settings):
            choices.append(ModelChoice(cached.name, cached.name, f"hub · {cached.size / 2**20:,.0f} MiB"))
        return choices

    def action_pick_model(self) -> None:
        if self.reply is not None or self.loading:
            self.notify("Wait for the reply or the load to end (Esc stops a reply).", timeout=3)
            return

        def done(choice: ModelChoice | None) -> None:
            if choice is not None:
                self.remote = None  # the picker's models are local ones
                self.load_model(choice.model, choice.label)

        self.push_screen(ModelPicker(self.model_choices(), self.model_label), done)

    # Pulls from the hub, asked for in the model picker

    def _picker(self) -> ModelPicker | None:
        return self.screen if isinstance(self.screen, ModelPicker) else None

    @on(ModelPicker.PullAsked)
    def _pull_asked(self, message: ModelPicker.PullAsked) -> None:
        picker = self._picker()
        name = HubModelName.parse(message.name)
        if picker is None:
            return
        if name is None:
            picker.pull_ended(f"'{message.name}' is not a hub model name: write user/repo or user/repo:QUANT", failed=True)
            return
        self._pull_cancel = threading.Event()
        picker.pull_started(str(name))
        self._pull(name, self._pull_cancel)

    @on(ModelPicker.CancelAsked)
    def _pull_cancel_asked(self) -> None:
        if self._pull_cancel is not None:
            self._pull_cancel.set()

    @work(thread=True, exclusive=True, group="pull")
    def _pull(self, name: HubModelName, cancel: threading.Event) -> None:
        """Pulls into the Hugging Face cache; a cancelled or failed pull takes no file for a model."""
        try:
            result = pull(name, self.settings, progress=lambda done, total: self.post_message(PullProgress(done, total)), cancel=cancel)
        except PullCancelled as error:
            self.post_message(PullEnded(str(name), str(error), cancelled=True))
        except (LocalchatError, OSError) as error:
            self.post_message(PullEnded(str(name), str(error)))
        else:
            self.post_message(PullEnded(result.model.name, None))

    def on_pull_progress(self, message: PullProgress) -> None:
        if (picker := self._picker()) is not None and picker.pulling is not None:
            picker.pull_progress(message.done, message.total)

    def on_pull_ended(self, message: PullEnded) -> None:
        self._pull_cancel = None
        if message.cancelled:
            text = f"Pull cancelled: {message.error}"
        elif message.error:
            text = f"Could not pull {message.name}: {message.error}"
        else:
            text = f"Pulled {message.name}: Enter loads it"
        picker = self._picker()
        if picker is None:  # the dialog was closed meanwhile
            self.notify(text, severity="error" if message.error and not message.cancelled else "information", timeout=6)
            return
        if message.error is None:
            picker.show_choices(self.model_choices(), message.name)
        picker.pull_ended(text, failed=message.error is not None)

    # Shutdown

    def action_quit(self) -> None:
        if self.reply is not None:
            # Keep what was written: the worker stops within a token or a prompt chunk, its last
            # text and its end arrive as messages, the reply is stored, then the app exits. No
            # timeout: closing the engine under a running worker would crash.
            self._quit_after_reply = True
            self._stop_reply()
            return
        self.exit(self.return_code or 0)

    def on_unmount(self) -> None:
        worker_busy = False
        if self.reply is not None:
            self._stop_reply()
            worker_busy = not self.reply.done.wait(timeout=10)
        # A worker still inside the backend would use a freed context: leave that to process exit.
        if not worker_busy and self.engine is not None and id(self.engine) in self._owned:
            self.engine.close()
            self._owned.discard(id(self.engine))
        if self._owns_store:
            self.store.close()


def run_chat_app(model: str | None, settings: Settings, request: PlanRequest, remote: RemoteEndpoint | None = None,
                 draft_model: str | None = None, loras: tuple[LoraSpec, ...] = ()) -> int:
    """`localchat chat`: the app on `model` (None for the default) or on the `remote` server, with
    `draft_model` drafting for `model` and the adapters `loras` on it; returns the exit status."""
    app = ChatApp(settings, model=model, request=request, remote=remote, draft_model=draft_model, loras=loras)
    return app.run() or 0
