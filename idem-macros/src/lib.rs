//! Procedural macros for idem. Use them through `idem-tower` (feature
//! `macros`); generated code names only `::idem_tower::__private` paths.

mod attr;
mod expand;

use proc_macro::TokenStream;

// The reference is a page of its own, so that the tests crate compiles its
// examples (tests/src/lib.rs): as doc tests of this crate they would build
// idem-tower and its whole tree a second time, for the host.
#[doc = include_str!("idempotent.md")]
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let original = proc_macro2::TokenStream::from(item.clone());
    match expand::expand(attr.into(), item.into()) {
        Ok(expanded) => expanded.into(),
        // Keep the function as written, so a mistake in the attribute is
        // the one error reported, not every use of the handler as well.
        Err(err) => {
            let mut tokens = err.into_compile_error();
            tokens.extend(original);
            tokens.into()
        }
    }
}
