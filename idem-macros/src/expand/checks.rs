//! What `#[idempotent]` refuses, before it emits anything that depends on
//! it: an item that is no axum handler, and arguments that cannot work.

use proc_macro2::Ident;
use proc_macro2::TokenStream;
use quote::quote;
use syn::{FnArg, Item, ItemFn, Pat, Safety, Type};

use super::{argument_types, combine, contains_impl};
use crate::attr::Args;

/// The annotated item, checked to be something axum can call as a handler.
pub(super) fn parse_handler(item: TokenStream) -> syn::Result<ItemFn> {
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
    for arg in &sig.inputs {
        if let FnArg::Typed(arg) = arg {
            let mut same = Vec::new();
            bindings_named(&arg.pat, name, &mut same);
            errors.extend(same.into_iter().map(|binding| {
                syn::Error::new_spanned(
                    binding,
                    format!(
                        "this binds `{name}`, the handler's own name: #[idempotent] makes \
                         `{name}` a unit struct (what the router is given), and in a pattern \
                         that name matches the struct instead of binding the value. Give the \
                         binding another name"
                    ),
                )
            }));
        }
    }
    for ty in argument_types(&function) {
        if contains_impl(quote!(#ty)) {
            errors.push(syn::Error::new_spanned(
                ty,
                "an extractor must be a concrete type, not `impl Trait`",
            ));
        }
    }
    combine(errors).map_or(Ok(function), Err)
}

/// The identifiers `pat` binds that are spelled `name`.
fn bindings_named<'a>(pat: &'a Pat, name: &Ident, found: &mut Vec<&'a Ident>) {
    match pat {
        Pat::Ident(binding) => {
            if binding.ident == *name {
                found.push(&binding.ident);
            }
            if let Some((_, sub)) = &binding.subpat {
                bindings_named(sub, name, found);
            }
        }
        Pat::TupleStruct(tuple) => tuple
            .elems
            .iter()
            .for_each(|elem| bindings_named(elem, name, found)),
        Pat::Tuple(tuple) => tuple
            .elems
            .iter()
            .for_each(|elem| bindings_named(elem, name, found)),
        Pat::Slice(slice) => slice
            .elems
            .iter()
            .for_each(|elem| bindings_named(elem, name, found)),
        Pat::Or(or) => or
            .cases
            .iter()
            .for_each(|case| bindings_named(case, name, found)),
        Pat::Struct(fields) => fields
            .fields
            .iter()
            .for_each(|field| bindings_named(&field.pat, name, found)),
        Pat::Reference(reference) => bindings_named(&reference.pat, name, found),
        Pat::Paren(paren) => bindings_named(&paren.pat, name, found),
        Pat::Type(typed) => bindings_named(&typed.pat, name, found),
        _ => {}
    }
}

/// Mistakes in the arguments that are certain from the signature alone:
/// a body extractor before the last argument (or two of them), and `Tx`
/// on a handler that is not transactional.
pub(super) fn check_arguments(args: &Args, function: &ItemFn) -> syn::Result<()> {
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

    combine(errors).map_or(Ok(()), Err)
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
