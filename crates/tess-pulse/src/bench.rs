//! `tess bench pulse` figures (filled later).
