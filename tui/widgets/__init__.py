"""Small widgets the chat app is composed of; none of them calls the engine."""
