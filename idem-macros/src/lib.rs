//! Procedural macros for idem. Use them through `idem-tower` (feature
//! `macros`); generated code names only `::idem_tower::__private` paths.
