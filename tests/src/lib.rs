//! Helpers for weir's end-to-end tests: start a real `weir` process on an ephemeral port
//! in a temporary data dir, and stop it.
