"""The run store: content-addressed stage folders, verified before use and published atomically, and the file
hashing and locks they rest on."""
