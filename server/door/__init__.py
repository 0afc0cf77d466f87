"""The door: what a connection and a request must be before the app answers them. HTTP/1.1 and TLS rules
while bytes are parsed, framing, Host headers, body limits, API keys and who holds the connections."""
