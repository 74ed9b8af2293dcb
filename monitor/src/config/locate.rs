//! Where a key of a YAML document is written: the line and column of each key, read with the
//! YAML parser's own spans, so flow style (`{for: 2s}`), several keys on a line and keys
//! spread over lines are placed as an editor shows them.
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::collections::BTreeMap;

/// Every key of a document, by dotted path (`alerts.rules.gpu_memory_high.for`; a list item's
/// keys by the list's path), at its (line, column), both from 1.
#[derive(Debug, Default)]
pub struct KeyPlaces(BTreeMap<String, (u64, u64)>);

impl KeyPlaces {
    /// The keys of `text`; none where it does not parse.
    pub fn of(text: &str) -> Self {
        let mut places = Self::default();
        if let Ok(node) = serde_saphyr::from_str::<Node>(text) {
            node.collect("", &mut places.0);
        }
        places
    }

    /// Where the dotted `field` is written, or its nearest written ancestor.
    pub fn find(&self, field: &str) -> Option<(u64, u64)> {
        let mut path = field;
        loop {
            if let Some(place) = self.0.get(path) {
                return Some(*place);
            }
            path = &path[..path.rfind('.')?];
        }
    }
}

/// A YAML node, keeping only what placing keys needs.
enum Node {
    Map(Vec<(Spanned<String>, Node)>),
    Seq(Vec<Node>),
    Scalar,
}

impl Node {
    fn collect(self, prefix: &str, out: &mut BTreeMap<String, (u64, u64)>) {
        match self {
            Node::Map(entries) => {
                for (key, value) in entries {
                    let path = if prefix.is_empty() {
                        key.value.clone()
                    } else {
                        format!("{prefix}.{}", key.value)
                    };
                    let at = (key.referenced.line(), key.referenced.column());
                    out.entry(path.clone()).or_insert(at);
                    value.collect(&path, out);
                }
            }
            Node::Seq(items) => items.into_iter().for_each(|v| v.collect(prefix, out)),
            Node::Scalar => {}
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let value = map.next_value::<Node>()?;
            let key = Spanned::new(key.value.0, key.referenced, key.defined);
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
}

/// A mapping key as text, whatever scalar spells it (`1:` and `true:` are keys too).
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = KeyText;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
        }
        d.deserialize_any(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_and_flow_keys_are_placed_where_they_are_written() {
        let text = "a:\n  b:\n    - c: 1\n  d: 2\ne: {f: 1,\n    g: {h: x}}\n";
        let places = KeyPlaces::of(text);
        assert_eq!(places.find("a.b.c"), Some((3, 7)));
        assert_eq!(places.find("a.d"), Some((4, 3)));
        assert_eq!(places.find("e.f"), Some((5, 5)));
        assert_eq!(places.find("e.g.h"), Some((6, 9)));
        // Not written: its nearest written ancestor.
        assert_eq!(places.find("a.b.zz"), Some((2, 3)));
        assert_eq!(places.find("zz.y"), None);
        assert!(
            KeyPlaces::of("a: [\n").find("a").is_none(),
            "no parse, no places"
        );
    }
}
