"""What the backends share across flavours: the URL registry and server-side scripts."""
