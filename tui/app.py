"""The chat app: a conversation list, the open conversation, a message editor and a status bar.

The app is the controller, and this file its map: what each key does and what each message
changes. Widgets (widgets/) only show things and post messages; each dialog (widgets/dialogs/)
asks one thing. The model is loaded, replies are generated and models are pulled in thread
workers (model_loading.py, replies.py, pulls.py) that talk back through `post_message` only. The
rules of a stored conversation are localchat.conversation's; each finished message goes to the
conversation store in its own transaction.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.driver import Driver
from textual.screen import ModalScreen
from textual.widgets import Footer

from localchat.adapters import LoraSpec
from localchat.chat_engine import ChatEngine, EngineChat
from localchat.conversation import OpenConversation, Turn
from localchat.errors import LocalchatError
from localchat.hardware import gpu_memory_used_bytes, process_rss_bytes
from localchat.history import ConversationStore
from localchat.hub import HubModelName
from localchat.model_loading import ModelLoading, ProgressRelay
from localchat.models import DEFAULT_MODEL_NAME, PACKAGED_MODELS
from localchat.planner import PlanRequest
from localchat.remote_endpoint import RemoteEndpoint
from localchat.session import GenerationSettings, GenerationStats
from localchat.settings import DEFAULT_LOOKUP_DRAFT, Settings
from localchat.tui.model_loading import LoadProgress, ModelFailed, ModelLoaded, load_engine
from localchat.tui.pulls import PullEnded, PullProgress, pull_model
from localchat.tui.replies import Reply, ReplyEnded, ReplyStats, ReplyText, write_reply
from localchat.tui.widgets.dialogs import Confirm, HelpScreen, ModelChoice, ModelPicker, SystemPromptEditor, TextPrompt
from localchat.tui.widgets.dialogs.help import help_rows
from localchat.tui.widgets.dialogs.model_picker import model_choices
from localchat.tui.widgets.load_bar import LoadBar
from localchat.tui.widgets.messages import AssistantMessage, ConversationView, Notice, UserMessage
from localchat.tui.widgets.prompt import PromptInput
from localchat.tui.widgets.sidebar import ConversationList
from localchat.tui.widgets.status import StatusBar

REPLY_SETTINGS = GenerationSettings(max_tokens=1024, lookup_draft=DEFAULT_LOOKUP_DRAFT)
MEMORY_S = 1.0  # how often the status bar's memory figures are sampled
THEMES = ("textual-dark", "textual-light")
# `kill` and a closed terminal window end the app as Ctrl+Q does, keeping the reply being written; the exit
# status is then a killed process's, 128 + the signal's number. asyncio takes no signal handlers on Windows.
QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if sys.platform != "win32" else ()


class ChatApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "localchat"
    # Below 70 columns the conversation list goes (Ctrl+B still shows it), below 14 rows the key bar
    # (F1 still lists the keys): the conversation, the editor and the status keep the room (app.tcss).
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (70, "-wide")]
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-short"), (14, "-tall")]
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
        loading: ModelLoading | None = None,
        loading_progress: ProgressRelay | None = None,
    ) -> None:
        """Loads `model` on start (or connects to `remote`), or uses `engine` as given (the caller
        then closes it). `draft_model` drafts for `model` (speculative decoding) and `loras` adapt
        it, not models picked later: a draft model must share its target's vocabulary, an adapter
        its base model's tensors. `loading` is `model`'s load, started before the app (while it
        imports and draws), its progress to `loading_progress`."""
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
        self._loading, self._loading_progress = loading, loading_progress
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
        self._quitting: int | None = None  # the exit status, once told to quit while a reply is written

    def get_driver_class(self) -> type[Driver]:
        chosen = super().get_driver_class()
        if not QUIT_SIGNALS:  # Windows: no hangup to outlive (and no termios to import)
            return chosen
        from localchat.tui.terminal import terminal_driver

        return terminal_driver(chosen)

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
                yield LoadBar(id="load")
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
        for number in QUIT_SIGNALS:
            asyncio.get_running_loop().add_signal_handler(number, self._quit, 128 + number)
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
        self.query_one(LoadBar).start(label)
        self.status.state = "loading"
        self._load(model, label)

    @work(thread=True, exclusive=True, group="load")
    def _load(self, model: str | None, label: str) -> None:
        first = model == self._model_arg
        draft_model, loras = (self._draft_model, self._loras) if first else (None, ())
        source: str | None | ModelLoading = model
        if first and self._loading is not None:  # the load started before the app, taken once
            source, self._loading = self._loading, None
            if self._loading_progress is not None:
                self._loading_progress.attach(lambda fraction: self.post_message(LoadProgress(fraction)))
        load_engine(source, label, self.settings, self.request, remote=self.remote, draft_model=draft_model, loras=loras,
                    post=self.post_message)

    def on_load_progress(self, message: LoadProgress) -> None:
        self.query_one(LoadBar).progress(message.fraction)

    async def on_model_loaded(self, message: ModelLoaded) -> None:
        old, self.engine = self.engine, message.engine
        self._owned.add(id(message.engine))
        if old is not None and id(old) in self._owned:
            self._owned.discard(id(old))
            old.close()
        self.model_label = message.label
        self.loading = False
        self.query_one(LoadBar).display = False
        self._rebuild_chat()
        self._show_engine()
        packaged = PACKAGED_MODELS.get(message.label)
        if packaged is not None and packaged.name == DEFAULT_MODEL_NAME:  # say what the default model is, once loaded
            self.notify(f"{message.label} is ready: {packaged.note}", timeout=6)
        else:
            self.notify(f"{message.label} is ready", timeout=2)

    async def on_model_failed(self, message: ModelFailed) -> None:
        self.loading = False
        self.query_one(LoadBar).display = False
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

    @property
    def chat(self) -> EngineChat | None:
        """The open conversation's chat on the engine (None without one)."""
        return self.conversation.chat if self.conversation is not None else None

    def _show_engine(self) -> None:
        assert self.engine is not None
        self.status.show_engine(self.engine, gpu_memory_used_bytes() if self.engine.uses_gpu else None)
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
        self._show_left_out(use.left_out)

    def _show_left_out(self, left_out: int) -> None:
        self.status.left_out = left_out
        self.conversation_view.mark_context_start(left_out, self.engine.context_size if self.engine is not None else None)

    def _sample_memory(self) -> None:
        self.status.rss_bytes = process_rss_bytes()
        if self.engine is not None and self.engine.uses_gpu:
            self.status.gpu_bytes = gpu_memory_used_bytes()

    def _token_count(self, text: str) -> int | None:
        """How many tokens `text` is for the model (None before one is loaded, or when it
        cannot count)."""
        return self.engine.token_count(text) if self.engine is not None else None

    # Conversations

    def _rebuild_chat(self) -> None:
        if self.conversation is not None:
            self.conversation.attach(self.engine, thinking=self.thinking)

    def _refresh_list(self) -> None:
        self.query_one(ConversationList).show(self.store.conversations(), self.conversation.id if self.conversation else None)

    async def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation, or a fresh one when `conversation_id` is None."""
        self._stop_reply()
        self.conversation = OpenConversation.open(self.store, conversation_id, self.engine, thinking=self.thinking)
        await self.conversation_view.show(self.conversation.messages(), self._token_count)
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
        if not text or not self._can_generate():
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
            top = self.conversation_view.top_of(last)
            if top is not last:
                await top.remove()
            await last.remove()
        await self.conversation_view.query("#unanswered").remove()
        await self._start_reply(turn)

    async def _start_reply(self, turn: Turn) -> None:
        # The toasts shown so far go: at 80x24 they sit over the conversation, where the reply is written.
        self.clear_notifications()
        self.reply = await Reply.start(turn, self.conversation_view)
        self._show_left_out(turn.chat.left_out())
        self.status.state = "writing"
        self.status.tokens_per_s = self.status.ttft_s = None
        self._generate(self.reply)

    @work(thread=True, group="reply")
    def _generate(self, reply: Reply) -> None:
        write_reply(reply, self.post_message)

    async def on_reply_text(self, message: ReplyText) -> None:
        if self.reply is not None:
            await self.reply.show(message.text)

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
        if message.error:
            self.notify(message.error, title="The reply failed", severity="error", timeout=8)
        await reply.end(message.error, self._token_count)
        self.status.state = "ready" if self.engine is not None else "no model"
        if stats is not None and self._shows(reply):
            self.status.tokens_per_s = stats.decode_tok_s
            self.status.ttft_s = stats.ttft_s
            if (used := reply.turn.chat.context_used()) is not None:
                self.status.context_used = used
        self._refresh_list()
        if self._quitting is not None:
            self.exit(self.return_code or self._quitting)

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

    # Dialogs

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_rows(self.BINDINGS)))

    def action_pick_model(self) -> None:
        if self.reply is not None or self.loading:
            self.notify("Wait for the reply or the load to end (Esc stops a reply).", timeout=3)
            return

        def done(choice: ModelChoice | None) -> None:
            if choice is not None:
                self.remote = None  # the picker's models are local ones
                self.load_model(choice.model, choice.label)

        self.push_screen(ModelPicker(model_choices(self.settings), self.model_label), done)

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
        pull_model(name, self.settings, cancel, self.post_message)

    def on_pull_progress(self, message: PullProgress) -> None:
        if (picker := self._picker()) is not None and picker.pulling is not None:
            picker.pull_progress(message.done, message.total)

    def on_pull_ended(self, message: PullEnded) -> None:
        self._pull_cancel = None
        picker = self._picker()
        if picker is None:  # the dialog was closed meanwhile
            self.notify(message.summary(), severity="error" if message.failed else "information", timeout=6)
            return
        if message.error is None:
            picker.show_choices(model_choices(self.settings), message.name)
        picker.pull_ended(message.summary(), failed=message.error is not None)

    # Shutdown

    def action_quit(self) -> None:
        self._quit(0)

    def _quit(self, status: int) -> None:
        """Exit with `status` (Ctrl+Q's 0, or a signal's), once the reply being written is stored."""
        if self.reply is not None:
            # Keep what was written: the worker stops within a token or a prompt chunk, its last
            # text and its end arrive as messages, the reply is stored, then the app exits. No
            # timeout: closing the engine under a running worker would crash.
            if self._quitting is None:  # the first to ask says how the app ends
                self._quitting = status
            self._stop_reply()
            return
        self.exit(self.return_code or status)

    def on_unmount(self) -> None:
        for number in QUIT_SIGNALS:
            asyncio.get_running_loop().remove_signal_handler(number)
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
                 draft_model: str | None = None, loras: tuple[LoraSpec, ...] = (), loading: ModelLoading | None = None,
                 loading_progress: ProgressRelay | None = None) -> int:
    """`localchat chat`: the app on `model` (None for the default; `loading` if its load has started)
    or on the `remote` server, with `draft_model` drafting for `model` and the adapters `loras` on
    it; returns the exit status."""
    app = ChatApp(settings, model=model, request=request, remote=remote, draft_model=draft_model, loras=loras,
                  loading=loading, loading_progress=loading_progress)
    return app.run() or 0
