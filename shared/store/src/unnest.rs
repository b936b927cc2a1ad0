//! Bulk writes: a batch of rows bound as one array per column and read back as a table with
//! `UNNEST`. Positional binds are where such a statement goes wrong (a column bound in the wrong
//! place is noticed only by a test that happens to give the two columns different values), so
//! each bulk write declares its row once with [`unnest_rows!`]: the struct's fields, in order,
//! are the table's columns, its parameters and its binds. The statement names the columns, and
//! a name it gets wrong is an error the first time it runs.
//!
//! Parameters carry their types from the fields' Rust types (sqlx declares them when it prepares
//! the statement), so the SQL needs no casts that could disagree with the binds.

/// Declares a bulk write's row: the struct, [`table`](#method.table) (its `UNNEST … AS alias(…)`
/// for the statement) and `bind` (one array per field, in the same order). Every field's type is
/// `Clone` and a Postgres array element (`PgHasArrayType`).
macro_rules! unnest_rows {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident $(<$lt:lifetime>)? {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name $(<$lt>)? {
            $( $(#[$fmeta])* pub $field: $ty ),+
        }

        impl $(<$lt>)? $name $(<$lt>)? {
            /// `UNNEST($1, …, $n) AS alias(field, …)`: the rows bound by `bind`, as a table
            /// with one column per field.
            pub(crate) fn table(alias: &str) -> String {
                let names = [$(stringify!($field)),+];
                let params: Vec<String> = (1..=names.len()).map(|i| format!("${i}")).collect();
                format!("UNNEST({}) AS {alias}({})", params.join(", "), names.join(", "))
            }

            /// Binds `rows` as the arrays of [`Self::table`], one per field, in order.
            pub(crate) fn bind<'q>(
                rows: &[Self],
                query: ::sqlx::query::Query<'q, ::sqlx::Postgres, ::sqlx::postgres::PgArguments>,
            ) -> ::sqlx::query::Query<'q, ::sqlx::Postgres, ::sqlx::postgres::PgArguments>
            where
                $($lt: 'q,)?
            {
                query
                    $( .bind(rows.iter().map(|r| r.$field.clone()).collect::<Vec<$ty>>()) )+
            }
        }
    };
}

pub(crate) use unnest_rows;

#[cfg(test)]
mod tests {
    unnest_rows! {
        struct Example<'a> {
            id: i64,
            name: &'a str,
            note: Option<&'a str>,
        }
    }

    #[test]
    fn the_table_lists_the_fields_in_order_with_a_parameter_each() {
        assert_eq!(
            Example::table("u"),
            "UNNEST($1, $2, $3) AS u(id, name, note)"
        );
    }

    #[test]
    fn each_field_is_bound_as_one_array() {
        use sqlx::{Arguments, Execute};
        let rows = [
            Example {
                id: 1,
                name: "a",
                note: None,
            },
            Example {
                id: 2,
                name: "b",
                note: Some("n"),
            },
        ];
        let mut query = Example::bind(&rows, sqlx::query("SELECT 1"));
        let args = query.take_arguments().unwrap().unwrap();
        assert_eq!(args.len(), 3);
        let Example { id, name, note } = &rows[1];
        assert_eq!((*id, *name, *note), (2, "b", Some("n")));
    }
}
