//! Black-box test helpers.
