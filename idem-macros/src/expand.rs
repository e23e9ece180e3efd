//! Expanding `#[idempotent]`: the user's function, kept intact under a
//! hidden name, and a unit struct of the handler's name whose
//! `axum::handler::Handler` impl wraps that function in an
//! `IdempotencyLayer`, and which dereferences to the function so that it
//! can still be called.

use proc_macro2::{Literal, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Attribute, FnArg, Item, ItemFn, ReturnType, Safety, Type};

use crate::attr::{Args, Fingerprint, InFlightPolicy};

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
    // handler's name) and, like the impls, any `#[cfg]`.
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
    let values: Vec<_> = (0..types.len())
        .map(|i| format_ident!("__idem_arg{}", i, span = span))
        .collect();

    let mut inner = function.clone();
    inner.sig.ident = hidden.clone();

    // `create_order(args)` still calls the function: the unit struct
    // dereferences to a function pointer, and a call expression derefs its
    // callee. Unit tests call it this way, and so does the check
    // `#[axum::debug_handler]` emits when it sits above `#[idempotent]`.
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
    let pointer = quote_spanned!(span=> fn(#(#types),*) -> #p::BoxFuture<#output>);
    let callable = quote_spanned! {span=>
        #(#cfgs)*
        #[allow(clippy::type_complexity)]
        impl #p::Deref for #name {
            type Target = #pointer;

            fn deref(&self) -> &Self::Target {
                fn call(#(#values: #types),*) -> #p::BoxFuture<#output> {
                    #boxed
                }
                &(call as #pointer)
            }
        }
    };

    let handler = match check_arguments(args, function) {
        Ok(()) => handler_impl(args, function, &types, &values),
        // The errors say what to fix; an impl that asks nothing of the state
        // keeps the handler's routes from adding errors of their own.
        Err(err) => {
            let err = err.into_compile_error();
            quote_spanned! {span=>
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
    };

    quote_spanned! {span=>
        #[doc(hidden)]
        #inner

        #(#docs_and_cfgs)*
        #[allow(non_camel_case_types)]
        #[derive(#p::Clone, #p::Copy, #p::Debug)]
        #vis struct #name;

        #callable

        #handler
    }
}

/// The `axum::handler::Handler` impl: for any router state that gives the
/// handle and on which every argument is an extractor.
fn handler_impl(
    args: &Args,
    function: &ItemFn,
    types: &[&Type],
    values: &[proc_macro2::Ident],
) -> TokenStream {
    let p = quote!(::idem_tower::__private);
    let name = &function.sig.ident;
    let span = name.span();

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

    let key = &args.key.lit;
    let mut settings = TokenStream::new();
    if let Some(retention) = args.retention {
        let retention = duration(retention);
        settings.extend(quote_spanned!(span=> .retention(#retention)));
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
            InFlightPolicy::Reject => quote_spanned!(span=> #p::InFlightPolicy::Reject),
            InFlightPolicy::Wait(wait) => {
                let wait = duration(*wait);
                quote_spanned!(span=> #p::InFlightPolicy::Wait(#wait))
            }
        };
        settings.extend(quote_spanned!(span=> .in_flight(#in_flight)));
    }
    if let Some(fingerprint) = &args.fingerprint {
        let spec = match fingerprint {
            Fingerprint::Request => quote_spanned!(span=> #p::FingerprintSpec::Request),
            Fingerprint::MethodAndRoute => {
                quote_spanned!(span=> #p::FingerprintSpec::MethodAndRoute)
            }
            Fingerprint::JsonFields(pointers) => {
                quote_spanned!(span=> #p::json_fields(&[#(#pointers),*]))
            }
        };
        settings.extend(quote_spanned!(span=> .fingerprint(#spec)));
    }
    if args.shared_across_callers {
        settings.extend(quote_spanned!(span=> .shared_across_callers()));
    }
    let mut layer = quote_spanned!(span=> #p::layer_with_key(__idem_handle, #key) #settings);
    if args.transactional {
        layer = quote_spanned!(span=> #p::transactional(#layer));
    }

    let cfgs = function.attrs.iter().filter(|a| a.path().is_ident("cfg"));
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

/// Mistakes in the arguments that are certain from the signature alone:
/// a body extractor before the last argument (or two of them), and `Tx`
/// on a handler that is not transactional.
fn check_arguments(args: &Args, function: &ItemFn) -> syn::Result<()> {
    let name = &function.sig.ident;
    let types: Vec<&Type> = argument_types(function).collect();
    let mut errors = Vec::new();

    let bodies: Vec<(usize, &Type)> = types
        .iter()
        .enumerate()
        .filter(|(_, ty)| reads_body(ty))
        .map(|(i, ty)| (i, *ty))
        .collect();
    match bodies.as_slice() {
        [] => {}
        [(i, ty)] if *i + 1 != types.len() => errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "`{}` reads the request body, so it must be the last argument of `{name}`: \
                 move it after `{}`",
                type_name(ty),
                type_name(types[types.len() - 1]),
            ),
        )),
        [_] => {}
        [(_, first), rest @ ..] => {
            for (_, ty) in rest {
                errors.push(syn::Error::new_spanned(
                    ty,
                    format!(
                        "`{}` reads the request body, and so does `{}`: a request has one \
                         body, so `{name}` can take one argument that reads it, as its last \
                         argument. Keep one of them",
                        type_name(ty),
                        type_name(first),
                    ),
                ));
            }
        }
    }

    if !args.transactional {
        for ty in &types {
            if last_segment(ty).is_some_and(|segment| segment.ident == "Tx") {
                errors.push(syn::Error::new_spanned(
                    ty,
                    format!(
                        "`{}` is the database transaction of a transactional handler, and \
                         `{name}` is not transactional: add `transactional` to the attribute, \
                         as in #[idempotent(key = {:?}, transactional)]",
                        type_name(ty),
                        args.key.lit.value(),
                    ),
                ));
            }
        }
    }

    match errors.into_iter().reduce(|mut all, next| {
        all.combine(next);
        all
    }) {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// The last segment of a path type, such as `Json<Order>` in
/// `axum::Json<Order>`.
fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match ty {
        Type::Path(path) if path.qself.is_none() => path.path.segments.last(),
        _ => None,
    }
}

/// Whether `ty` is one of axum's extractors that read the request body
/// (and so implement `FromRequest` only), by name, as
/// `#[axum::debug_handler]` tells them.
fn reads_body(ty: &Type) -> bool {
    const BODY_EXTRACTORS: [&str; 11] = [
        "Json",
        "Form",
        "RawForm",
        "Multipart",
        "JsonLines",
        "Protobuf",
        "String",
        "Bytes",
        "BytesMut",
        "Body",
        "Request",
    ];
    last_segment(ty).is_some_and(|segment| BODY_EXTRACTORS.iter().any(|b| segment.ident == b))
}

/// A type as written, for messages: `axum::Json<Order>`, not the spaced
/// `axum :: Json < Order >` of its token stream.
fn type_name(ty: &Type) -> String {
    let spaced = quote!(#ty).to_string();
    let chars: Vec<char> = spaced.chars().collect();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| {
            c != ' ' || (i > 0 && i + 1 < chars.len() && word(chars[i - 1]) && word(chars[i + 1]))
        })
        .map(|(_, &c)| c)
        .collect()
}

/// `Duration::new(secs, nanos)`, exactly as parsed.
fn duration(duration: std::time::Duration) -> TokenStream {
    let secs = Literal::u64_suffixed(duration.as_secs());
    let nanos = Literal::u32_suffixed(duration.subsec_nanos());
    quote!(::idem_tower::__private::Duration::new(#secs, #nanos))
}
