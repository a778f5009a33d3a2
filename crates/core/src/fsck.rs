//! Offline consistency check and repair (placeholder until the checker lands).
