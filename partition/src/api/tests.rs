//! `openapi.json` held to the router: every route and method it describes is served with
//! the status and body it says, every other method on those paths gets 405 with the
//! `Error` body, and no route is served that it leaves out.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::OPENAPI;
use super::routes::{ROUTES, tests::state};
use crate::cpu::exits::{ExitCounters, VcpuCounters};

const METHODS: [&str; 6] = ["GET", "PUT", "PATCH", "POST", "DELETE", "HEAD"];

fn spec() -> Value {
    serde_json::from_str(OPENAPI).expect("openapi.json is JSON")
}

/// The schema `r` (`#/components/schemas/NAME`) points at.
fn deref<'a>(spec: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("a $ref outside the schemas: {r}"));
            let t = &spec["components"]["schemas"][name];
            assert!(t.is_object(), "no schema {name}");
            t
        }
        None => s,
    }
}

/// Why `v` does not fit `schema` (the parts of OpenAPI 3.0 the document uses), if it does not.
fn misfit(spec: &Value, schema: &Value, v: &Value, at: &str) -> Option<String> {
    let s = deref(spec, schema);
    if v.is_null() {
        return (s["nullable"] != json!(true)).then(|| format!("{at}: null, not nullable"));
    }
    let ty = s["type"].as_str().unwrap_or("object");
    let fits = match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        t => return Some(format!("{at}: schema type {t} unknown to this check")),
    };
    if !fits {
        return Some(format!("{at}: {v} is not {ty}"));
    }
    if let Some(e) = s["enum"].as_array()
        && !e.contains(v)
    {
        return Some(format!("{at}: {v} not in {e:?}"));
    }
    if let Some(items) = s.get("items") {
        for (i, x) in v.as_array().into_iter().flatten().enumerate() {
            if let Some(m) = misfit(spec, items, x, &format!("{at}[{i}]")) {
                return Some(m);
            }
        }
    }
    let obj = v.as_object()?;
    for k in s["required"].as_array().into_iter().flatten() {
        let k = k.as_str().unwrap();
        if !obj.contains_key(k) {
            return Some(format!("{at}: no {k:?} in {v}"));
        }
    }
    let props = s["properties"].as_object();
    for (k, x) in obj {
        let p = props.and_then(|p| p.get(k));
        let sub = match (p, s.get("additionalProperties")) {
            (Some(p), _) => p,
            (None, Some(Value::Bool(false))) => {
                return Some(format!("{at}: {k:?} is not described"));
            }
            (None, Some(a @ Value::Object(_))) => a,
            (None, _) => continue,
        };
        if let Some(m) = misfit(spec, sub, x, &format!("{at}.{k}")) {
            return Some(m);
        }
    }
    None
}

/// A body the route's request schema accepts (its enums' first value), or none.
fn good_body(spec: &Value, op: &Value) -> Vec<u8> {
    let Some(rb) = op.get("requestBody") else {
        return Vec::new();
    };
    let name = rb["$ref"].as_str().unwrap().rsplit('/').next().unwrap();
    let schema = deref(
        spec,
        &spec["components"]["requestBodies"][name]["content"]["application/json"]["schema"],
    );
    let mut body = serde_json::Map::new();
    for (k, p) in schema["properties"].as_object().unwrap() {
        body.insert(k.clone(), p["enum"][0].clone());
    }
    // PUT /state's first value is "paused": resume at once after, in the test below.
    Value::Object(body).to_string().into_bytes()
}

#[test]
fn the_openapi_document_describes_exactly_the_routes_served() {
    let spec = spec();
    let paths = spec["paths"].as_object().expect("paths");
    let described: BTreeSet<&str> = paths.keys().map(String::as_str).collect();
    let served: BTreeSet<&str> = ROUTES.iter().map(|r| r.path).collect();
    assert_eq!(described, served, "openapi.json's paths against ROUTES");
    for route in ROUTES {
        let item = paths[route.path].as_object().unwrap();
        let ops: BTreeSet<String> = item.keys().map(|m| m.to_uppercase()).collect();
        let listed: BTreeSet<String> = route.methods.iter().map(|m| m.name.to_string()).collect();
        assert_eq!(
            ops, listed,
            "{}: methods described against served",
            route.path
        );
        for &super::routes::Method {
            name: method,
            status: code,
            schema,
            ..
        } in route.methods
        {
            let op = &item[&method.to_lowercase()];
            let ok: Vec<&String> = op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| k.starts_with('2'))
                .collect();
            assert_eq!(
                ok,
                [&code.to_string()],
                "{method} {}: its good status",
                route.path
            );
            let r =
                &op["responses"][code.to_string()]["content"]["application/json"]["schema"]["$ref"];
            assert_eq!(
                r.as_str(),
                Some(format!("#/components/schemas/{schema}").as_str()),
                "{method} {}: its answer's schema",
                route.path
            );
        }
    }
}

#[test]
fn every_route_answers_as_the_openapi_document_says() {
    let spec = spec();
    let error = json!({ "$ref": "#/components/schemas/Error" });
    for route in ROUTES {
        for method in METHODS {
            let s = state();
            match route.methods.iter().find(|m| m.name == method) {
                Some(&super::routes::Method {
                    status: code,
                    schema,
                    ..
                }) => {
                    let op = &spec["paths"][route.path][method.to_lowercase()];
                    let r = s.handle(method, route.path, &good_body(&spec, op));
                    assert_eq!(r.code, code, "{method} {}: {}", route.path, r.body);
                    let want = json!({ "$ref": format!("#/components/schemas/{schema}") });
                    if let Some(m) =
                        misfit(&spec, &want, &r.body, &format!("{method} {}", route.path))
                    {
                        panic!("{m}");
                    }
                    s.pause.resume();
                    // A body that breaks the request schema is a 400 with the Error body.
                    if op.get("requestBody").is_some() {
                        let r = s.handle(method, route.path, br#"{"nothing": 1}"#);
                        assert_eq!(r.code, 400, "{method} {}: {}", route.path, r.body);
                        assert_eq!(misfit(&spec, &error, &r.body, route.path), None);
                    }
                }
                None => {
                    let r = s.handle(method, route.path, b"");
                    assert_eq!(r.code, 405, "{method} {}: {}", route.path, r.body);
                    assert_eq!(misfit(&spec, &error, &r.body, route.path), None);
                }
            }
        }
    }
    let r = state().handle("GET", "/nothing", b"");
    assert_eq!(r.code, 404);
    assert_eq!(misfit(&spec, &error, &r.body, "/nothing"), None);
}

#[test]
fn a_vcpus_counters_fit_their_schema() {
    let spec = spec();
    let c = ExitCounters::default();
    c.hlt.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
    let v = VcpuCounters::read(1, 3, &c, [("halt_exits".to_string(), 2)].into());
    let doc = serde_json::to_value(&v).unwrap();
    assert_eq!(doc["exits"]["hlt"], 3);
    let schema = json!({ "$ref": "#/components/schemas/VcpuCounters" });
    assert_eq!(misfit(&spec, &schema, &doc, "vcpu"), None);
    // The check can fail: a key the schema does not describe, a wrong type.
    let mut extra = doc.clone();
    extra["index"] = json!(1);
    assert!(misfit(&spec, &schema, &extra, "vcpu").is_some());
    let mut wrong = doc;
    wrong["exits"]["hlt"] = json!("3");
    assert!(misfit(&spec, &schema, &wrong, "vcpu").is_some());
}
