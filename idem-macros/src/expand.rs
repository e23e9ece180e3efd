//! Expanding `#[idempotent]`: the user's function, kept intact under a
//! hidden name, and a unit struct of the handler's name whose
//! `axum::handler::Handler` impl wraps that function in an
//! `IdempotencyLayer`.

use proc_macro2::{Literal, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Item, ItemFn, ReturnType, Safety, Type};

use crate::attr::{Args, Fingerprint, InFlight};

/// The whole expansion, or every error found in the arguments and the
/// function together.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = Args::parse(attr);
    let handler = parse_handler(item);
    match (args, handler) {
        (Ok(args), Ok(handler)) => Ok(generate(&args, &handler)),
        (Err(mut first), Err(second)) => {
            first.combine(second);
            Err(first)
        }
        (Err(err), Ok(_)) | (Ok(_), Err(err)) => Err(err),
    }
}

/// The annotated item, checked to be something axum can call as a handler.
fn parse_handler(item: TokenStream) -> syn::Result<ItemFn> {
    let function = match syn::parse2::<Item>(item)? {
        Item::Fn(function) => function,
        other => {
            return Err(syn::Error::new_spanned(
                other,
                "#[idempotent] goes on an axum handler: an `async fn` outside any `impl` block",
            ));
        }
    };
    let sig = &function.sig;
    let name = &sig.ident;
    let mut errors = Vec::new();
    if let Some(receiver) = sig.receiver() {
        errors.push(syn::Error::new_spanned(
            receiver,
            format!(
                "#[idempotent] cannot go on a method taking `self`: axum handlers are free \
                 functions. Move `{name}` out of the `impl` block as `async fn {name}(...)` and \
                 reach what it needs from `self` through an extractor such as `State`"
            ),
        ));
    }
    if sig.asyncness.is_none() {
        let fn_token = &sig.fn_token;
        errors.push(syn::Error::new_spanned(
            quote!(#fn_token #name),
            format!("#[idempotent] handlers must be async: write `async fn {name}(...)`"),
        ));
    }
    if let Safety::Unsafe(token) = &sig.safety {
        errors.push(syn::Error::new(
            token.span,
            "an `unsafe fn` cannot be an axum handler: remove `unsafe` and use an `unsafe` \
             block inside",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            "#[idempotent] handlers cannot be generic: name concrete extractor types, as axum \
             handlers do",
        ));
    }
    for ty in argument_types(&function) {
        if contains_impl(quote!(#ty)) {
            errors.push(syn::Error::new_spanned(
                ty,
                "an extractor must be a concrete type, not `impl Trait`",
            ));
        }
    }
    match errors.into_iter().reduce(|mut all, next| {
        all.combine(next);
        all
    }) {
        Some(err) => Err(err),
        None => Ok(function),
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

fn generate(args: &Args, function: &ItemFn) -> TokenStream {
    let p = quote!(::idem_tower::__private);
    let name = function.sig.ident.clone();
    let span = name.span();
    let vis = function.vis.clone();
    let hidden = format_ident!("__idem_{}", name, span = span);

    // The struct takes the docs (it is what rustdoc shows under the
    // handler's name) and, like the impl, any `#[cfg]`.
    let docs_and_cfgs: Vec<&Attribute> = function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc") || a.path().is_ident("cfg"))
        .collect();
    let cfgs: Vec<&Attribute> = function
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .collect();

    let types: Vec<&Type> = argument_types(function).collect();
    let (impl_generics, marker, tuple, extractor_bounds) = match types.split_last() {
        None => (
            quote_spanned!(span=> <__IdemS>),
            quote_spanned!(span=> #p::Marker<()>),
            quote_spanned!(span=> ((),)),
            TokenStream::new(),
        ),
        Some((last, init)) => {
            let mut bounds = TokenStream::new();
            for ty in init {
                bounds.extend(quote_spanned! {ty.span()=>
                    #ty: #p::axum::extract::FromRequestParts<__IdemS> + #p::Send,
                });
            }
            bounds.extend(quote_spanned! {last.span()=>
                #last: #p::axum::extract::FromRequest<__IdemS, __IdemM> + #p::Send,
                __IdemM: 'static,
            });
            (
                quote_spanned!(span=> <__IdemS, __IdemM>),
                quote_spanned!(span=> #p::Marker<__IdemM>),
                quote_spanned!(span=> (__IdemM, #(#types,)*)),
                bounds,
            )
        }
    };
    let response_bound = match &function.sig.output {
        // `impl IntoResponse` cannot be named here; axum's own handler impl
        // still requires it of the function.
        ReturnType::Type(_, ty) if !contains_impl(quote!(#ty)) => {
            quote_spanned!(ty.span()=> #ty: #p::axum::response::IntoResponse,)
        }
        _ => TokenStream::new(),
    };

    let key = &args.key.lit;
    let mut settings = TokenStream::new();
    if let Some(ttl) = args.ttl {
        let ttl = duration(ttl);
        settings.extend(quote_spanned!(span=> .retention(#ttl)));
    }
    if let Some(lease) = args.lease {
        let lease = duration(lease);
        settings.extend(quote_spanned!(span=> .lease(#lease)));
    }
    if let Some(required) = args.required {
        settings.extend(quote_spanned!(span=> .required(#required)));
    }
    if let Some(in_flight) = &args.in_flight {
        let in_flight = match in_flight {
            InFlight::Reject => quote_spanned!(span=> #p::InFlight::Reject),
            InFlight::Wait(wait) => {
                let wait = duration(*wait);
                quote_spanned!(span=> #p::InFlight::Wait(#wait))
            }
        };
        settings.extend(quote_spanned!(span=> .in_flight(#in_flight)));
    }
    if let Some(fingerprint) = &args.fingerprint {
        let spec = match fingerprint {
            Fingerprint::Body => quote_spanned!(span=> #p::FingerprintSpec::Request),
            Fingerprint::None => quote_spanned!(span=> #p::FingerprintSpec::MethodAndRoute),
            Fingerprint::JsonFields(pointers) => {
                quote_spanned!(span=> #p::json_fields(&[#(#pointers),*]))
            }
        };
        settings.extend(quote_spanned!(span=> .fingerprint(#spec)));
    }

    let mut layer = quote_spanned!(span=> #p::layer_with_key(idem, #key) #settings);
    if args.transactional {
        layer = quote_spanned!(span=> #p::transactional(#layer));
    }

    let mut inner = function.clone();
    inner.sig.ident = hidden.clone();

    quote_spanned! {span=>
        #[doc(hidden)]
        #inner

        #(#docs_and_cfgs)*
        #[allow(non_camel_case_types)]
        #[derive(#p::Clone, #p::Copy, #p::Debug)]
        #vis struct #name;

        #(#cfgs)*
        impl #impl_generics #p::axum::handler::Handler<#marker, __IdemS> for #name
        where
            __IdemS: #p::StateWithHandle,
            #extractor_bounds
            #response_bound
        {
            type Future = #p::HandlerFuture;

            fn call(self, request: #p::axum::extract::Request, state: __IdemS) -> Self::Future {
                static POLICY: #p::PolicyCell = #p::PolicyCell::new();
                #p::call::<_, #tuple, __IdemS>(
                    &POLICY,
                    |idem| #layer,
                    #hidden,
                    request,
                    state,
                )
            }
        }
    }
}

/// `Duration::new(secs, nanos)`, exactly as parsed.
fn duration(duration: std::time::Duration) -> TokenStream {
    let secs = Literal::u64_suffixed(duration.as_secs());
    let nanos = Literal::u32_suffixed(duration.subsec_nanos());
    quote!(::idem_tower::__private::Duration::new(#secs, #nanos))
}
