//! Expanding `#[idempotent]`: the user's function, kept intact under a
//! hidden name, and a unit struct of the handler's name whose
//! `axum::handler::Handler` impl wraps that function in an
//! `IdempotencyLayer`, and which dereferences to the function so that it
//! can still be called. Here: the whole expansion and the struct;
//! `checks.rs` refuses what cannot work, `callable.rs` emits the `Deref`
//! impl, `handler.rs` the `Handler` impl and `layer.rs` the layer in it.

mod callable;
mod checks;
mod handler;
mod layer;

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::{Attribute, FnArg, ItemFn, Type};

use crate::attr::Args;

/// The whole expansion, or every error found in the arguments and the
/// function together.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = Args::parse(attr);
    let handler = checks::parse_handler(item);
    match (args, handler) {
        (Ok(args), Ok(handler)) => Ok(generate(&args, &handler)),
        (Err(mut first), Err(second)) => {
            first.combine(second);
            Err(first)
        }
        (Err(err), Ok(_)) | (Ok(_), Err(err)) => Err(err),
    }
}

/// The types of the handler's arguments, that is its extractors, in order.
fn argument_types(function: &ItemFn) -> impl Iterator<Item = &Type> {
    function.sig.inputs.iter().filter_map(|arg| match arg {
        FnArg::Typed(arg) => Some(&*arg.ty),
        FnArg::Receiver(_) => None,
    })
}

/// Whether `tokens` hold `impl Trait` anywhere (which cannot be named in a
/// where clause).
fn contains_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => contains_impl(group.stream()),
        _ => false,
    })
}

/// Every error in `errors` as one, or `None` if there is none.
fn combine(errors: Vec<syn::Error>) -> Option<syn::Error> {
    errors.into_iter().reduce(|mut all, next| {
        all.combine(next);
        all
    })
}

/// The handler as every part of the expansion names it.
struct Handler<'a> {
    function: &'a ItemFn,
    /// The handler's name, which the unit struct takes.
    name: &'a Ident,
    /// Where the expansion is spanned: the handler's name.
    span: Span,
    /// The name the function is kept under.
    hidden: Ident,
    /// Its arguments' types, that is its extractors, in order.
    types: Vec<&'a Type>,
    /// The variables its arguments are bound to, in order.
    values: Vec<Ident>,
    /// Its `#[cfg]`s, which every impl takes too.
    cfgs: Vec<&'a Attribute>,
}

impl<'a> Handler<'a> {
    fn new(function: &'a ItemFn) -> Self {
        let name = &function.sig.ident;
        let span = name.span();
        let types: Vec<&Type> = argument_types(function).collect();
        Self {
            function,
            name,
            span,
            hidden: format_ident!("__idem_{}", name, span = span),
            values: (0..types.len())
                .map(|i| format_ident!("__idem_arg{}", i, span = span))
                .collect(),
            types,
            cfgs: function
                .attrs
                .iter()
                .filter(|a| a.path().is_ident("cfg"))
                .collect(),
        }
    }
}

/// The path of what the expansion uses from `idem-tower`.
fn private() -> TokenStream {
    quote!(::idem_tower::__private)
}

fn generate(args: &Args, function: &ItemFn) -> TokenStream {
    let p = private();
    let handler = Handler::new(function);
    let Handler {
        name, span, hidden, ..
    } = &handler;
    let vis = &function.vis;

    // The struct takes the docs (it is what rustdoc shows under the
    // handler's name) and, like the impls, any `#[cfg]`.
    let docs_and_cfgs = function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc") || a.path().is_ident("cfg"));

    let mut inner = function.clone();
    inner.sig.ident = hidden.clone();

    let callable = callable::deref_impl(&handler);
    let handler_impl = match checks::check_arguments(args, function) {
        Ok(()) => handler::handler_impl(args, &handler),
        Err(err) => handler::refused_impl(&handler, err),
    };

    quote_spanned! {*span=>
        #[doc(hidden)]
        #inner

        #(#docs_and_cfgs)*
        #[allow(non_camel_case_types)]
        #[derive(#p::Clone, #p::Copy, #p::Debug)]
        #vis struct #name;

        #callable

        #handler_impl
    }
}
