"""The protocol-independent layer every front end uses between its wire methods and the broker core."""
