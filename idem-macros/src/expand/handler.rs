//! The `axum::handler::Handler` impl of an `#[idempotent]` handler: its
//! extractors bound on the router state, its call wrapped in the layer
//! (`layer.rs`); or, when its arguments were refused, a stand-in.

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ReturnType, Type};

use super::layer::layer;
use super::{Handler, private};
use crate::attr::Args;

/// The `axum::handler::Handler` impl: for any router state that gives the
/// handle and on which every argument is an extractor.
pub(super) fn handler_impl(args: &Args, handler: &Handler<'_>) -> TokenStream {
    let p = private();
    let Handler {
        function,
        name,
        span,
        types,
        values,
        cfgs,
        ..
    } = handler;
    let span = *span;

    // Each bound is on the state, spanned on its argument: the compiler
    // checks it once it knows the router state, and an argument that is
    // not an extractor is reported in the words of `HeadArg`/`LastArg`,
    // pointing at the argument.
    let mut bounds = TokenStream::new();
    let mut extract = TokenStream::new();
    let (impl_generics, marker) = match types.split_last() {
        None => (
            quote_spanned!(span=> <__IdemS>),
            quote_spanned!(span=> #p::Marker<()>),
        ),
        Some((last, init)) => {
            if !init.is_empty() {
                extract.extend(quote_spanned! {span=>
                    let (mut __idem_parts, __idem_body) = __idem_request.into_parts();
                });
            }
            for (ty, value) in init.iter().zip(values) {
                bounds.extend(spanned_on(ty, quote!(__IdemS: #p::HeadArg<#ty>)));
                extract.extend(quote_spanned! {span=>
                    let #value = match <__IdemS as #p::HeadArg<#ty>>::extract(&mut __idem_parts, &__idem_state).await {
                        #p::Ok(value) => value,
                        #p::Err(rejection) => return rejection,
                    };
                });
            }
            if !init.is_empty() {
                extract.extend(quote_spanned! {span=>
                    let __idem_request = #p::axum::extract::Request::from_parts(__idem_parts, __idem_body);
                });
            }
            let value = &values[init.len()];
            bounds.extend(spanned_on(
                last,
                quote!(__IdemS: #p::LastArg<#last, __IdemM>),
            ));
            bounds.extend(quote_spanned!(span=> __IdemM: 'static,));
            extract.extend(quote_spanned! {span=>
                let #value = match <__IdemS as #p::LastArg<#last, __IdemM>>::extract(__idem_request, &__idem_state).await {
                    #p::Ok(value) => value,
                    #p::Err(rejection) => return rejection,
                };
            });
            (
                quote_spanned!(span=> <__IdemS, __IdemM>),
                quote_spanned!(span=> #p::Marker<__IdemM>),
            )
        }
    };
    if types.is_empty() {
        extract.extend(quote_spanned!(span=> let _ = (__idem_request, __idem_state);));
    }
    // Only what the function returns is marked as its outcome: a rejection
    // from an extractor (which never reaches it) is not kept. Spanned on
    // the return type, where a type that is no response is reported.
    let ran_span = match &function.sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => span,
    };
    let response = quote_spanned!(ran_span=> __idem_response);
    let ran = quote_spanned! {ran_span=>
        let #response = #name(#(#values),*).await;
        #p::handler_ran(#response)
    };

    let layer = layer(args, span);

    quote_spanned! {span=>
        #(#cfgs)*
        impl #impl_generics #p::axum::handler::Handler<#marker, __IdemS> for #name
        where
            __IdemS: #p::StateWithHandle,
            #bounds
        {
            type Future = #p::HandlerFuture;

            fn call(self, __idem_request: #p::axum::extract::Request, __idem_state: __IdemS) -> Self::Future {
                static POLICY: #p::PolicyCell = #p::PolicyCell::new();
                #p::call(
                    &POLICY,
                    |__idem_handle| #layer,
                    move |__idem_request: #p::axum::extract::Request, __idem_state: __IdemS| async move {
                        #extract
                        #ran
                    },
                    __idem_request,
                    __idem_state,
                )
            }
        }
    }
}

/// `predicate,` spanned over `ty` as written, so that an unsatisfied bound
/// underlines the whole argument type.
fn spanned_on(ty: &Type, predicate: TokenStream) -> TokenStream {
    let mut tokens = quote!(#ty).into_iter();
    let first = tokens.next().map_or_else(|| ty.span(), |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
    let mut spanned: Vec<TokenTree> = predicate
        .into_iter()
        .map(|mut tree| {
            if !matches!(tree, TokenTree::Group(_)) {
                tree.set_span(first);
            }
            tree
        })
        .collect();
    // The bound's last token, `>`, ends where the type ends.
    if let Some(end) = spanned.last_mut() {
        end.set_span(last);
    }
    let mut out: TokenStream = spanned.into_iter().collect();
    out.extend(quote_spanned!(last=> ,));
    out
}

/// What stands in for the `Handler` impl when the arguments were refused:
/// the errors, which say what to fix, and an impl that asks nothing of the
/// state, which keeps the handler's routes from adding errors of their own.
pub(super) fn refused_impl(handler: &Handler<'_>, err: syn::Error) -> TokenStream {
    let p = private();
    let Handler {
        name, span, cfgs, ..
    } = handler;
    let err = err.into_compile_error();
    quote_spanned! {*span=>
        #err

        #(#cfgs)*
        impl<__IdemS> #p::axum::handler::Handler<#p::Marker<()>, __IdemS> for #name
        where
            __IdemS: #p::Clone + #p::Send + #p::Sync + 'static,
        {
            type Future = #p::HandlerFuture;

            fn call(self, _: #p::axum::extract::Request, _: __IdemS) -> Self::Future {
                ::core::unreachable!("#[idempotent] reported a compile error for this handler")
            }
        }
    }
}
