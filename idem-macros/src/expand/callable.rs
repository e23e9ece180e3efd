//! The `Deref` impl that keeps an `#[idempotent]` handler callable as the
//! function it was written as.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ReturnType;

use super::{Handler, contains_impl, private};

/// `create_order(args)` still calls the function: the unit struct
/// dereferences to a function pointer, and a call expression derefs its
/// callee. Unit tests call it this way, and so does the check
/// `#[axum::debug_handler]` emits when it sits above `#[idempotent]`.
pub(super) fn deref_impl(handler: &Handler<'_>) -> TokenStream {
    let p = private();
    let Handler {
        function,
        name,
        span,
        hidden,
        types,
        values,
        cfgs,
    } = handler;
    let span = *span;
    let (output, boxed) = match &function.sig.output {
        ReturnType::Default => (
            quote_spanned!(span=> ()),
            quote_spanned!(span=> #p::Box::pin(#hidden(#(#values),*))),
        ),
        // An `impl IntoResponse` cannot be named in the pointer's type.
        ReturnType::Type(_, ty) if contains_impl(quote!(#ty)) => (
            quote_spanned!(span=> #p::axum::response::Response),
            quote_spanned! {span=>
                #p::Box::pin(async move {
                    #p::axum::response::IntoResponse::into_response(#hidden(#(#values),*).await)
                })
            },
        ),
        ReturnType::Type(_, ty) => (
            quote!(#ty),
            quote_spanned!(span=> #p::Box::pin(#hidden(#(#values),*))),
        ),
    };
    let pointer = quote_spanned!(span=> fn(#(#types),*) -> #p::FnFuture<#output>);
    quote_spanned! {span=>
        #(#cfgs)*
        #[allow(clippy::type_complexity)]
        impl #p::Deref for #name {
            type Target = #pointer;

            fn deref(&self) -> &Self::Target {
                fn call(#(#values: #types),*) -> #p::FnFuture<#output> {
                    #boxed
                }
                &(call as #pointer)
            }
        }
    }
}
